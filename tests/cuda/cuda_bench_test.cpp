// Timings of the GEMM wrapper and the fused cross-entropy on the device (not a correctness test). Runs only
// when OLMOSFT_CUDA_BENCH=1 (scripts/gpu-check.sh sets it after the tests have passed), else it is skipped.
// Prints: GEMM TFLOP/s at LM shapes and its ratio to the cuBLAS bf16 figure measured on the H200 test machine
// (769-798 TFLOP/s at 8192^3, docs/cuda.md; we print the ratio to 780), and the fused LM head + CE forward
// and backward time against the time of the same GEMMs alone (1 GEMM forward, 3 backward), i.e. the
// fraction of the time the non-GEMM work costs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "cuda/check.h"
#include "cuda/gemm.h"
#include "cuda/xent.h"
#include "cuda_test_util.h"

using namespace olmosft::cuda;
using namespace olmosft::cuda::test;

namespace {

bool bench_enabled() {
  const char* b = std::getenv("OLMOSFT_CUDA_BENCH");
  return b && std::string(b) == "1";
}

// Median-free simple timing: one warm-up, then `reps` runs between two events; milliseconds per run.
double time_ms(const std::function<void()>& f, int reps) {
  f();
  check(cudaDeviceSynchronize(), "bench warm-up");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(cudaEventRecord(a), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) f();
  check(cudaEventRecord(b), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / reps;
}

constexpr double kCublasMeasuredTflops = 780.0;

}  // namespace

TEST(CudaBench, GemmThroughput) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  if (!bench_enabled()) GTEST_SKIP() << "skipped: benchmark (set OLMOSFT_CUDA_BENCH=1)";
  Gemm gemm;
  struct Shape {
    const char* what;
    Op a, b;
    int64_t M, N, K;
    OutType ct;
  };
  const Shape shapes[] = {
      {"8192^3 N,T bf16", Op::N, Op::T, 8192, 8192, 8192, OutType::BF16},
      {"x W^T 8192x11008x4096", Op::N, Op::T, 8192, 11008, 4096, OutType::BF16},
      {"dx = dy W 8192x4096x11008", Op::N, Op::N, 8192, 4096, 11008, OutType::BF16},
      {"dW += dy^T x 11008x4096x8192 fp32", Op::T, Op::N, 11008, 4096, 8192, OutType::F32}};
  for (const Shape& s : shapes) {
    const int64_t ar = s.a == Op::N ? s.M : s.K, ac = s.a == Op::N ? s.K : s.M;
    const int64_t br = s.b == Op::N ? s.K : s.N, bc = s.b == Op::N ? s.N : s.K;
    DeviceArray<uint16_t> A(size_t(ar * ac)), B(size_t(br * bc));
    DeviceArray<float> C(size_t(s.M * s.N));
    check(cudaMemset(A.data(), 0x3c, A.size() * 2), "memset");  // 0x3c3c: ~0.0115
    check(cudaMemset(B.data(), 0x3c, B.size() * 2), "memset");
    check(cudaMemset(C.data(), 0, C.size() * 4), "memset");
    const double ms = time_ms(
        [&] {
          gemm.matmul(s.a, s.b, s.M, s.N, s.K, 1.0f, A.data(), ac, B.data(), bc,
                      s.ct == OutType::F32 ? 1.0f : 0.0f, C.data(), s.ct, s.N);
        },
        10);
    const double tflops = 2.0 * double(s.M) * double(s.N) * double(s.K) / (ms * 1e-3) / 1e12;
    std::printf("bench gemm %-36s %8.3f ms %7.1f TFLOP/s  ratio to cuBLAS %.0f: %.2f\n", s.what, ms, tflops,
                kCublasMeasuredTflops, tflops / kCublasMeasuredTflops);
  }
}

TEST(CudaBench, FusedXentAgainstItsGemms) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  if (!bench_enabled()) GTEST_SKIP() << "skipped: benchmark (set OLMOSFT_CUDA_BENCH=1)";
  // Olmo-3 7B's head: d 4096, 100278 valid of 100352 rows; 8192 tokens.
  const int64_t N = 8192, d = 4096, Vr = 100352, V = 100278;
  Gemm gemm;
  XentConfig cfg;
  cfg.valid_vocab = V, cfg.z_loss = 1e-5f, cfg.vocab_chunk = 16384, cfg.row_block = 8192;
  FusedXent xent(gemm, N, d, Vr, cfg);
  const auto hh = random_bf16(size_t(N * d), 1.0f, 1);
  std::vector<int32_t> tt(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) tt[size_t(i)] = int32_t((i * 7919) % V);
  DeviceArray<uint16_t> h(hh), W(size_t(Vr * d)), dh(size_t(N * d));
  check(cudaMemset(W.data(), 0x3c, W.size() * 2), "memset");
  DeviceArray<int32_t> t(tt);
  DeviceArray<float> lse(static_cast<size_t>(N)), dW(size_t(Vr * d));
  check(cudaMemset(dW.data(), 0, dW.size() * 4), "memset");
  std::printf("bench xent workspace %.1f MiB\n", double(xent.workspace_bytes()) / (1 << 20));
  const double fwd = time_ms([&] { xent.forward(h.data(), W.data(), t.data(), nullptr, N, lse.data()); }, 3);
  const double bwd = time_ms(
      [&] {
        xent.backward(h.data(), W.data(), t.data(), nullptr, lse.data(), N, 1.0f / N, dh.data(), dW.data());
      },
      3);
  // The same GEMMs alone (per chunk: logits; then dh and dW), on the same tile buffers' shapes.
  const int64_t ch = cfg.vocab_chunk;
  DeviceArray<float> tile(size_t(N * ch));
  DeviceArray<uint16_t> g16(size_t(N * ch));
  DeviceArray<float> dhacc(size_t(N * d));
  check(cudaMemset(g16.data(), 0, g16.size() * 2), "memset");
  auto gemms = [&](bool backward) {
    for (int64_t c0 = 0; c0 < V; c0 += ch) {
      const int64_t nc = std::min(ch, V - c0);
      gemm.matmul(Op::N, Op::T, N, nc, d, 1.0f, h.data(), d, W.data() + c0 * d, d, 0.0f, tile.data(),
                  OutType::F32, nc);
      if (!backward) continue;
      gemm.matmul(Op::N, Op::N, N, d, nc, 1.0f, g16.data(), nc, W.data() + c0 * d, d, 1.0f, dhacc.data(),
                  OutType::F32, d);
      gemm.matmul(Op::T, Op::N, nc, d, N, 1.0f, g16.data(), nc, h.data(), d, 1.0f, dW.data() + c0 * d,
                  OutType::F32, d);
    }
  };
  const double gf = time_ms([&] { gemms(false); }, 3), gb = time_ms([&] { gemms(true); }, 3);
  const double flop = 2.0 * double(N) * double(V) * double(d);
  std::printf("bench xent forward  %8.2f ms (its GEMMs alone %8.2f ms: ratio %.2f; %.0f TFLOP/s)\n", fwd, gf,
              gf / fwd, flop / (fwd * 1e-3) / 1e12);
  std::printf("bench xent backward %8.2f ms (its GEMMs alone %8.2f ms: ratio %.2f; %.0f TFLOP/s)\n", bwd, gb,
              gb / bwd, 3 * flop / (bwd * 1e-3) / 1e12);
}
