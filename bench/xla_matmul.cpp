// bench_xla_matmul PLUGIN [N] [CHAIN] [REPS] [PEAK_TFLOPS]: a chain of CHAIN bf16 N x N x N matmuls (default
// 8 x 8192, products summed in f32, each result rounded back to bf16 for the next) compiled once through our
// PJRT runtime and StableHLO builder on PLUGIN (cpu | cuda | tpu | PATH), operands already on the device.
// Prints the compile time, the best of REPS executions (after one warm-up) as TFLOP/s and, given the device's
// peak (e.g. 989 for an H200's dense bf16), as a fraction of it. The figure to compare with is what the same
// machine's JAX or PyTorch reaches on the same chain (xla_backend.md: 686-731 TFLOP/s on an H200 via JAX).
// Self-contained (src/xla and src/core only), so tests/xla-accel builds it where the CPU libraries are
// absent.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "xla/hlo_builder.h"
#include "xla/pjrt.h"

using namespace olmosft;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PLUGIN [N] [CHAIN] [REPS] [PEAK_TFLOPS]\n", argv[0]);
    return 2;
  }
  const std::string plugin = argv[1];
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int chain = argc > 3 ? std::atoi(argv[3]) : 8;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 10;
  const double peak = argc > 5 ? std::atof(argv[5]) : 0;
  if (n < 1 || chain < 1 || reps < 1) {
    std::fprintf(stderr, "%s: N, CHAIN and REPS must be >= 1\n", argv[0]);
    return 2;
  }
  try {
    xla::Client client =
        xla::Client::create(plugin, plugin == "cpu" ? xla::ClientOptions{1} : xla::ClientOptions{});
    const xla::TensorType t{xla::ElementType::kBF16, {n, n}};
    xla::HloBuilder hb("matmul_chain");
    xla::Value x = hb.argument(t);
    const xla::Value w = hb.argument(t);
    for (int i = 0; i < chain; ++i)
      x = hb.convert(hb.dot_general(x, w, {{}, {}, {1}, {0}}, xla::ElementType::kF32),
                     xla::ElementType::kBF16);
    hb.returns({x});
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    xla::Executable exe = client.compile(hb.module());
    const double compile_s = std::chrono::duration<double>(clock::now() - t0).count();
    // Entries of magnitude ~1/sqrt(n) keep the chain's values bounded.
    std::vector<uint16_t> a(size_t(n * n)), b(size_t(n * n));
    uint32_t s = 12345;
    for (size_t i = 0; i < a.size(); ++i) {
      s = s * 1664525u + 1013904223u;
      const float u = (float((s >> 8) & 0xffff) / 65536.0f - 0.5f) * 2.0f / std::sqrt(float(n));
      a[i] = f32_to_bf16(u);
      b[i] = f32_to_bf16(u * 0.5f);
    }
    xla::Buffer da = client.to_device(a.data(), t), db = client.to_device(b.data(), t);
    xla::Buffer* args[] = {&da, &db};
    exe.execute(args);  // warm-up
    double best = 1e300;
    for (int r = 0; r < reps; ++r) {
      t0 = clock::now();
      exe.execute(args);  // returns once the outputs are ready
      best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    }
    const double tflops = 2.0 * double(n) * double(n) * double(n) * chain / best / 1e12;
    std::printf("XLA-MATMUL plugin=%s platform=%s n=%lld chain=%d compile_s=%.3f best_s=%.6f tflops=%.2f",
                plugin.c_str(), client.platform_name().c_str(), static_cast<long long>(n), chain, compile_s,
                best, tflops);
    if (peak > 0) std::printf(" of_peak=%.3f", tflops / peak);
    std::printf("\n");
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_xla_matmul: %s\n", e.what());
    return 1;
  }
  return 0;
}
