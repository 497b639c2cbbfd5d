// `make bench` -> build/bench_xla_gemm [N] [reps]: an f32 N x N x N matmul (default 1024) on XLA's CPU PJRT
// plugin (a StableHLO dot_general from xla::HloBuilder, compiled once; operands already on the device, the
// timed part is execute + wait) against olmosft's CPU GEMM (kernels/gemm.h, the `auto` library choice) in the
// same run, with the same operands. Prints GFLOP/s over wall time and per CPU-second for both, the ratio, and
// the largest difference between the two products. Best of `reps` timed runs after one warm-up.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "kernels/gemm.h"
#include "xla/hlo_builder.h"
#include "xla/pjrt.h"

using namespace olmosft;

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  const double flop = 2.0 * double(n) * double(n) * double(n);
  std::vector<float> a(size_t(n * n)), b(size_t(n * n)), c(size_t(n * n));
  const Rng rng{42};
  for (size_t i = 0; i < a.size(); ++i) a[i] = rng.uniform(i) - 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = rng.uniform(a.size() + i) - 0.5f;

  xla::Client client = xla::Client::create("cpu", xla::ClientOptions{1});
  xla::HloBuilder hb("gemm");
  const xla::TensorType t{xla::ElementType::kF32, {n, n}};
  xla::Value A = hb.argument(t), B = hb.argument(t);
  hb.returns({hb.dot_general(A, B, {{}, {}, {1}, {0}})});
  const double c0 = bench::now();
  xla::Executable exe = client.compile(hb.module());
  const double compile_s = bench::now() - c0;
  xla::Buffer da = client.to_device(a.data(), t), db = client.to_device(b.data(), t);
  xla::Buffer* args[] = {&da, &db};
  std::vector<float> xla_c;
  const auto [xw, xc] = bench::best_of(reps, [&] { xla_c = exe.execute(args)[0].to_host<float>(); });
  const auto [xw_only, xc_only] = bench::best_of(reps, [&] { exe.execute(args); });

  ScopedCpuGemm lib(CpuGemm{auto_gemm_lib(), ComputeDtype::F32});
  const auto [ow, oc] = bench::best_of(reps, [&] {
    gemm<float>(Trans::N, Trans::N, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  });
  double max_diff = 0;
  for (size_t i = 0; i < c.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(c[i] - xla_c[i])));

  std::printf("## f32 matmul %ld^3 (best of %d)\n\n", long(n), reps);
  std::printf("| path | ms (wall) | GFLOP/s (wall) | GFLOP per CPU-s |\n|---|---|---|---|\n");
  std::printf("| XLA CPU plugin, execute + wait | %.2f | %.1f | %.1f |\n", 1e3 * xw_only,
              flop / xw_only / 1e9, flop / xc_only / 1e9);
  std::printf("| XLA CPU plugin, execute + copy to host | %.2f | %.1f | %.1f |\n", 1e3 * xw, flop / xw / 1e9,
              flop / xc / 1e9);
  std::printf("| olmosft sgemm (%s) | %.2f | %.1f | %.1f |\n\n", gemm_lib_name(cpu_gemm().fp32), 1e3 * ow,
              flop / ow / 1e9, flop / oc / 1e9);
  std::printf(
      "XLA / olmosft (execute + wait): %.2fx wall, %.2fx per CPU-s; compile %.2f s; max |difference| "
      "%.2e\n",
      ow / xw_only, oc / xc_only, compile_s, max_diff);
  std::printf("BENCH xla_gemm n=%ld xla_gflops=%.1f olmosft_gflops=%.1f ratio=%.3f\n", long(n),
              flop / xw_only / 1e9, flop / ow / 1e9, ow / xw_only);
  return 0;
}
