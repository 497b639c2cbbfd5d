// `make bench` → build/bench_gemm: the machine's fp32 FMA peak (1 and 2 threads) and, at training shapes,
// the three CPU GEMM set-ups measured in the same run (through olmosft::gemm_compute): OpenBLAS fp32, oneDNN
// fp32 and bf16 compute (oneDNN, bf16 operands, fp32 sums), as ratios to each other and fractions of the
// measured peaks. The "auto" fp32 choice (kernels/gemm.h auto_gemm_lib) is printed with the figures.
// Prints markdown table rows. Best of `reps` timed runs after one warm-up; the machine may be shared,
// so 2-thread numbers are noisy (see bench/RESULTS.md).
#include "kernels/gemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "core/threads.h"

using namespace olmosft;
using bench::cpu_now;
using bench::now;

namespace {
struct Rate {
  double wall = 0;     // best GFLOP/s over wall time
  double per_cpu = 0;  // best GFLOP per CPU-second (per-core efficiency)
};

// 12 independent 8-lane FMA chains per thread (enough to cover 2 pipes x 4-5 cycles latency).
double fma_loop(int64_t iters) {
#if defined(__FMA__) && defined(__AVX__)
  // Twelve named accumulators so they stay in ymm registers (an array is kept in memory at -O2).
  __m256 c0 = _mm256_set1_ps(0.001f), c1 = _mm256_set1_ps(0.002f), c2 = _mm256_set1_ps(0.003f),
         c3 = _mm256_set1_ps(0.004f), c4 = _mm256_set1_ps(0.005f), c5 = _mm256_set1_ps(0.006f),
         c6 = _mm256_set1_ps(0.007f), c7 = _mm256_set1_ps(0.008f), c8 = _mm256_set1_ps(0.009f),
         c9 = _mm256_set1_ps(0.010f), c10 = _mm256_set1_ps(0.011f), c11 = _mm256_set1_ps(0.012f);
  const __m256 a = _mm256_set1_ps(0.9999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm256_fmadd_ps(c0, a, b);
    c1 = _mm256_fmadd_ps(c1, a, b);
    c2 = _mm256_fmadd_ps(c2, a, b);
    c3 = _mm256_fmadd_ps(c3, a, b);
    c4 = _mm256_fmadd_ps(c4, a, b);
    c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b);
    c7 = _mm256_fmadd_ps(c7, a, b);
    c8 = _mm256_fmadd_ps(c8, a, b);
    c9 = _mm256_fmadd_ps(c9, a, b);
    c10 = _mm256_fmadd_ps(c10, a, b);
    c11 = _mm256_fmadd_ps(c11, a, b);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                           _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  float out[8];
  _mm256_storeu_ps(out, s);
  return double(out[0]);  // keeps the loop alive
#else
  (void)iters;
  return -1;
#endif
}

// The same with 16-lane AVX-512 FMAs where the CPU has them (Zen 4/5 and Intel server cores); -1 otherwise.
double fma512_loop(int64_t iters) {
#if defined(__AVX512F__)
  __m512 c0 = _mm512_set1_ps(0.001f), c1 = _mm512_set1_ps(0.002f), c2 = _mm512_set1_ps(0.003f),
         c3 = _mm512_set1_ps(0.004f), c4 = _mm512_set1_ps(0.005f), c5 = _mm512_set1_ps(0.006f),
         c6 = _mm512_set1_ps(0.007f), c7 = _mm512_set1_ps(0.008f), c8 = _mm512_set1_ps(0.009f),
         c9 = _mm512_set1_ps(0.010f), c10 = _mm512_set1_ps(0.011f), c11 = _mm512_set1_ps(0.012f);
  const __m512 a = _mm512_set1_ps(0.9999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm512_fmadd_ps(c0, a, b);
    c1 = _mm512_fmadd_ps(c1, a, b);
    c2 = _mm512_fmadd_ps(c2, a, b);
    c3 = _mm512_fmadd_ps(c3, a, b);
    c4 = _mm512_fmadd_ps(c4, a, b);
    c5 = _mm512_fmadd_ps(c5, a, b);
    c6 = _mm512_fmadd_ps(c6, a, b);
    c7 = _mm512_fmadd_ps(c7, a, b);
    c8 = _mm512_fmadd_ps(c8, a, b);
    c9 = _mm512_fmadd_ps(c9, a, b);
    c10 = _mm512_fmadd_ps(c10, a, b);
    c11 = _mm512_fmadd_ps(c11, a, b);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                           _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
  float out[16];
  _mm512_storeu_ps(out, s);
  return double(out[0]);  // keeps the loop alive
#else
  (void)iters;
  return -1;
#endif
}

// `threads` threads each running the FMA loop; many short runs (about 10 ms each), best of 40, so a
// shared machine's time slicing is filtered out.
Rate fma_peak(int threads, int lanes) {
  const int64_t iters = 5'000'000 * 8 / lanes;  // 0.96 GFLOP per thread
  Rate best;
  double sink = 0;
#if !defined(__AVX512F__)
  if (lanes == 16) return Rate{-1, -1};
#endif
#if !(defined(__FMA__) && defined(__AVX__))
  return Rate{-1, -1};
#endif
  for (int rep = 0; rep < 40; ++rep) {
    const double t0 = now(), c0 = cpu_now();
#pragma omp parallel num_threads(threads)
    {
      double r = lanes == 16 ? fma512_loop(iters) : fma_loop(iters);
#pragma omp atomic
      sink += r;
    }
    const double dt = now() - t0, dc = cpu_now() - c0;
    if (sink == 12345.0) std::printf(" ");  // keeps the loop's result observable
    const double gflop = double(threads) * double(iters) * 12 * double(lanes) * 2 / 1e9;
    best.wall = std::max(best.wall, gflop / dt);
    best.per_cpu = std::max(best.per_cpu, gflop / dc);
  }
  return best;
}

struct Shape3 {
  const char* name;
  Trans ta, tb;
  int64_t M, N, K;
};

Rate gemm_rate(const Shape3& s, int reps, const CpuGemm& g) {
  ScopedCpuGemm use(g);
  const int64_t a_rows = s.ta == Trans::N ? s.M : s.K, a_cols = s.ta == Trans::N ? s.K : s.M;
  const int64_t b_rows = s.tb == Trans::N ? s.K : s.N, b_cols = s.tb == Trans::N ? s.N : s.K;
  std::vector<float> A(size_t(a_rows * a_cols)), B(size_t(b_rows * b_cols)), C(size_t(s.M * s.N));
  Rng r{1, 2};
  for (size_t i = 0; i < A.size(); ++i) A[i] = r.normal(i) * 0.1f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = r.normal(i + A.size()) * 0.1f;
  const double gflop = 2.0 * double(s.M) * double(s.N) * double(s.K) / 1e9;
  Rate best;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 is the warm-up
    const double t0 = now(), c0 = cpu_now();
    gemm_compute<float>(Precision::Compute, s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), a_cols, B.data(),
                        b_cols, 0.f, C.data(), s.N);
    const double dt = now() - t0, dc = cpu_now() - c0;
    if (rep == 0) continue;
    best.wall = std::max(best.wall, gflop / dt);
    best.per_cpu = std::max(best.per_cpu, gflop / dc);
  }
  return best;
}
// One row per (shape, threads): GFLOP per CPU-second of each set-up (the stable figure on a shared machine;
// wall in the details), their ratios, and the best fp32 one as a fraction of the 1-core fp32 peak.
template <size_t NS>
void shape_table(const Shape3 (&shapes)[NS], const Rate* peak) {
  std::string why;
  const bool bf16 = onednn_bf16_supported(&why);
  std::printf(
      "\nfp32 library chosen by compute.gemm=auto on this machine: %s\n\n| shape | threads | OpenBLAS fp32 "
      "GFLOP/CPU-s (wall GFLOP/s) | oneDNN fp32 | bf16 compute (oneDNN) | oneDNN / OpenBLAS | bf16 / best "
      "fp32 "
      "| best fp32 / 1-core fp32 peak |\n|---|---|---|---|---|---|---|---|\n",
      gemm_lib_name(auto_gemm_lib()));
  for (const auto& s : shapes)
    for (int t : {1, 2}) {
      set_threads(t);
      const int reps = double(s.M) * double(s.N) * double(s.K) < 1e8 ? 40 : 5;
      const Rate ob = gemm_rate(s, reps, {GemmLib::OpenBLAS, ComputeDtype::F32});
      const Rate od = gemm_rate(s, reps, {GemmLib::OneDNN, ComputeDtype::F32});
      const Rate b16 = bf16 ? gemm_rate(s, reps, {GemmLib::OneDNN, ComputeDtype::BF16}) : Rate{-1, -1};
      const double best32 = std::max(ob.per_cpu, od.per_cpu);
      std::printf("| %s | %d | %.1f (%.1f) | %.1f (%.1f) | %.1f (%.1f) | %.2f | %.2f | %.2f |\n", s.name, t,
                  ob.per_cpu, ob.wall, od.per_cpu, od.wall, b16.per_cpu, b16.wall, od.per_cpu / ob.per_cpu,
                  b16.per_cpu / best32, peak[1].per_cpu > 0 ? best32 / peak[1].per_cpu : 0.0);
    }
  if (!bf16) std::printf("\nbf16 compute: %s\n", why.c_str());
}
}  // namespace

int main() {
  const int saved = num_threads();
  // peak[t]: the machine's fp32 peak for t threads = the better of the 8-lane (AVX2) and 16-lane (AVX-512)
  // FMA loops (equal on Zen 4, whose AVX-512 is double-pumped; 2x on Zen 5 and Intel server cores).
  Rate peak[3];
  std::printf(
      "| measurement | threads | GFLOP/s (wall, best) | fraction of wall peak | GFLOP per CPU-second | "
      "fraction of 1-core peak |\n|---|---|---|---|---|---|\n");
  for (int lanes : {8, 16})
    for (int t : {1, 2}) {
      Rate r = fma_peak(t, lanes);
      if (r.wall < 0) {
        std::printf("| fp32 FMA peak, %d-lane | %d | n/a (not built for this ISA) | | | |\n", lanes, t);
        continue;
      }
      if (r.wall > peak[t].wall) peak[t].wall = r.wall;
      if (r.per_cpu > peak[t].per_cpu) peak[t].per_cpu = r.per_cpu;
      std::printf("| fp32 FMA peak (12 x %d-lane FMA chains) | %d | %.1f | | %.1f | |\n", lanes, t, r.wall,
                  r.per_cpu);
    }
  std::printf("| **machine fp32 peak (best of the above)** | 1 | %.1f | 1.00 | %.1f | 1.00 |\n", peak[1].wall,
              peak[1].per_cpu);
  std::printf("| **machine fp32 peak (best of the above)** | 2 | %.1f | 1.00 | %.1f | %.2f |\n", peak[2].wall,
              peak[2].per_cpu, peak[1].per_cpu > 0 ? peak[2].per_cpu / peak[1].per_cpu : 0.0);
  const Shape3 shapes[] = {
      {"sgemm 1024^3 (NN)", Trans::N, Trans::N, 1024, 1024, 1024},
      {"fwd Y = X W^T, 2048 tok x 1024 -> 4096 (M x N x K = 2048x4096x1024, NT)", Trans::N, Trans::T, 2048,
       4096, 1024},
      {"bwd dX = dY W, 2048x1024x4096 (NN)", Trans::N, Trans::N, 2048, 1024, 4096},
      {"bwd dW = dY^T X, 4096x1024x2048 (TN)", Trans::T, Trans::N, 4096, 1024, 2048},
      {"LM head 512 tok x 1024 -> 32000 (NT)", Trans::N, Trans::T, 512, 32000, 1024},
      {"expert 128 tok x 1024 -> 512 (NT)", Trans::N, Trans::T, 128, 512, 1024},
  };
  shape_table(shapes, peak);
  set_threads(saved);
  return 0;
}
