// Standalone check of src/kernels/gemm_onednn.cpp against whichever oneDNN it is compiled with (run by
// scripts/check-onednn3.sh against PyPI's oneDNN 3.2, whose API differs from Debian 12's 2.6 that `make test`
// uses): f32 and bf16 matmuls, every transpose, padded leading dimensions, alpha and beta, against float64
// loops over the operands as oneDNN sees them. Exits non-zero on any mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <random>
#include <vector>

#include "kernels/gemm_onednn.h"

using olmosft::Trans;

namespace {
uint16_t to_bf16(float f) {  // nearest, ties to even (finite values only here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Largest |got - want| of one GEMM (13x17x70, lds padded by 3) against float64.
double one(bool bf16, Trans ta, Trans tb, float alpha, float beta, std::mt19937& rng) {
  const int64_t M = 13, N = 17, K = 70;
  const int64_t lda = (ta == Trans::N ? K : M) + 3, ldb = (tb == Trans::N ? N : K) + 3, ldc = N + 3;
  std::normal_distribution<float> nd;
  std::vector<float> A(size_t((ta == Trans::N ? M : K) * lda)), B(size_t((tb == Trans::N ? K : N) * ldb)),
      C(size_t(M * ldc));
  for (auto* v : {&A, &B, &C})
    for (float& x : *v) x = bf16 ? from_bf16(to_bf16(nd(rng))) : nd(rng);
  std::vector<double> want(C.begin(), C.end());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(ta == Trans::N ? A[size_t(i * lda + k)] : A[size_t(k * lda + i)]) *
             double(tb == Trans::N ? B[size_t(k * ldb + j)] : B[size_t(j * ldb + k)]);
      want[size_t(i * ldc + j)] = alpha * s + beta * double(C[size_t(i * ldc + j)]);
    }
  if (bf16) {
    std::vector<uint16_t> a16(A.size()), b16(B.size());
    for (size_t i = 0; i < A.size(); ++i) a16[i] = to_bf16(A[i]);
    for (size_t i = 0; i < B.size(); ++i) b16[i] = to_bf16(B[i]);
    olmosft::onednn::matmul_bf16(ta, tb, M, N, K, alpha, a16.data(), lda, b16.data(), ldb, beta, C.data(),
                                 ldc);
  } else {
    olmosft::onednn::matmul_f32(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  }
  double err = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      err = std::max(err, std::fabs(C[size_t(i * ldc + j)] - want[size_t(i * ldc + j)]));
  return err;
}
}  // namespace

int main() {
  const dnnl_version_t* v = dnnl_version();
  std::printf("oneDNN %d.%d.%d: %s\n", v->major, v->minor, v->patch, olmosft::onednn::description().c_str());
  std::string why;
  const bool bf16_ok = olmosft::onednn::bf16_supported(&why);
  std::mt19937 rng(7);
  int fails = 0, runs = 0;
  for (bool bf16 : {false, true}) {
    if (bf16 && !bf16_ok) {
      std::printf("bf16: skipped (%s)\n", why.c_str());
      continue;
    }
    for (Trans ta : {Trans::N, Trans::T})
      for (Trans tb : {Trans::N, Trans::T})
        for (float alpha : {1.0f, 0.5f, -2.0f})
          for (float beta : {0.0f, 1.0f, 2.0f}) {
            const double err = one(bf16, ta, tb, alpha, beta, rng);
            ++runs;
            if (!(err < 1e-4)) {  // 70 products of O(1) values in fp32, times |alpha| <= 2
              ++fails;
              std::printf("FAIL %s ta=%d tb=%d alpha=%g beta=%g: max error %.3g\n", bf16 ? "bf16" : "f32",
                          int(ta), int(tb), alpha, beta, err);
            }
          }
  }
  std::printf("%s: %d of %d GEMMs within 1e-4 of float64\n", fails ? "FAIL" : "PASS", runs - fails, runs);
  return fails ? 1 : 0;
}
