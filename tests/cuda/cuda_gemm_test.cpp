// cuBLASLt GEMM wrapper (src/cuda/gemm.h) against a float64 loop on the same bf16 inputs.
// Tolerance: a product of two bf16 values is exact in fp32 (8 + 8 significand bits), so the only error of
// the fp32-accumulated result is the K-term sum: |C - exact| <= gamma_K * sum_k |a_k b_k|, gamma_K = K *
// 2^-24 (the worst-case bound, any summation order), doubled for margin. A bf16 output adds one rounding:
// 2^-8 |exact|. beta = 1 adds the initial C (fp32, exact) with one more rounding (covered by the margin);
// with a bf16 C, cuBLASLt rounds twice: the product alpha A B to bf16 first (up to 2^-8 sum |a_k b_k|), then
// the sum with beta C (2^-8 |exact|). Measured on an H200 (issue #29): 311 of 3,072 elements of the
// transposed-both bf16 beta-1 case were one bf16 ulp off, over the single-rounding bound.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/check.h"
#include "cuda/gemm.h"
#include "cuda_test_util.h"

using namespace olmosft::cuda;
using namespace olmosft::cuda::test;

namespace {

struct Case {
  Op opA, opB;
  int64_t M, N, K;
  int64_t pad;  // extra elements per row of every operand (leading dimension > row length)
  OutType ct;
  float beta;
};

// Runs one case; returns the device result (as float) so the caller can check determinism.
std::vector<float> run_case(Gemm& gemm, const Case& c, bool check_values) {
  const int64_t a_rows = c.opA == Op::N ? c.M : c.K, a_cols = c.opA == Op::N ? c.K : c.M;
  const int64_t b_rows = c.opB == Op::N ? c.K : c.N, b_cols = c.opB == Op::N ? c.N : c.K;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const auto A = random_bf16(size_t(a_rows * lda), 1.0f, 11);
  const auto B = random_bf16(size_t(b_rows * ldb), 1.0f, 12);
  const auto C0 = random_f32(size_t(c.M * ldc), 1.0f, 13);
  DeviceArray<uint16_t> dA(A), dB(B);
  DeviceArray<float> dC32(C0);
  std::vector<uint16_t> C0b(C0.size());
  for (size_t i = 0; i < C0.size(); ++i) C0b[i] = olmosft::f32_to_bf16(C0[i]);
  DeviceArray<uint16_t> dC16(C0b);
  void* C = c.ct == OutType::F32 ? static_cast<void*>(dC32.data()) : static_cast<void*>(dC16.data());
  gemm.matmul(c.opA, c.opB, c.M, c.N, c.K, 1.0f, dA.data(), lda, dB.data(), ldb, c.beta, C, c.ct, ldc);
  check(cudaDeviceSynchronize(), "gemm test");
  std::vector<float> got(C0.size());
  if (c.ct == OutType::F32) {
    got = dC32.download();
  } else {
    const auto g16 = dC16.download();
    for (size_t i = 0; i < g16.size(); ++i) got[i] = olmosft::bf16_to_f32(g16[i]);
  }
  if (!check_values) return got;
  std::vector<double> gv, want, tol;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = bf(A[size_t(c.opA == Op::N ? i * lda + k : k * lda + i)]);
        const double b = bf(B[size_t(c.opB == Op::N ? k * ldb + j : j * ldb + k)]);
        s += a * b;
        sa += std::fabs(a * b);
      }
      const double c0 = c.ct == OutType::F32 ? double(C0[size_t(i * ldc + j)]) : bf(C0b[size_t(i * ldc + j)]);
      const double ref = s + double(c.beta) * c0;
      gv.push_back(got[size_t(i * ldc + j)]);
      want.push_back(ref);
      const bool bf16_out = c.ct == OutType::BF16, twice = bf16_out && c.beta != 0.0f;
      tol.push_back(2 * gamma32(c.K + 1) * (sa + std::fabs(c0)) + (bf16_out ? kBf16Rel * std::fabs(ref) : 0) +
                    (twice ? kBf16Rel * sa : 0));
    }
  EXPECT_EQ(count_bad("C", gv, want, tol), 0);
  // Padding columns of C are never written.
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = c.N; j < ldc; ++j) {
      const float before =
          c.ct == OutType::F32 ? C0[size_t(i * ldc + j)] : olmosft::bf16_to_f32(C0b[size_t(i * ldc + j)]);
      EXPECT_EQ(got[size_t(i * ldc + j)], before) << "padding written at " << i << "," << j;
    }
  return got;
}

}  // namespace

// The four transpose combinations, fp32 and bf16 output, beta 0 and 1, aligned and odd sizes.
TEST(CudaGemm, MatchesFloat64Reference) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  Gemm gemm;
  std::printf("cuBLASLt version %zu\n", cublaslt_version());
  const Case cases[] = {
      {Op::N, Op::T, 128, 96, 256, 0, OutType::BF16, 0.0f},  // y = x W^T
      {Op::N, Op::N, 128, 256, 96, 0, OutType::F32, 0.0f},   // dx = dy W
      {Op::T, Op::N, 96, 256, 128, 0, OutType::F32, 1.0f},   // dW += dy^T x
      {Op::T, Op::T, 64, 48, 80, 8, OutType::BF16, 1.0f},
      {Op::N, Op::T, 37, 51, 100, 3, OutType::F32, 0.0f},   // odd sizes and strides (low alignment)
      {Op::T, Op::N, 33, 17, 1000, 0, OutType::F32, 1.0f},  // long K
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("opA=" + std::to_string(int(c.opA)) + " opB=" + std::to_string(int(c.opB)) +
                 " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
    run_case(gemm, c, true);
  }
}

// The same call twice gives the same bits (the cached algorithm, no atomics).
TEST(CudaGemm, Deterministic) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  Gemm gemm;
  const Case c{Op::T, Op::N, 256, 512, 4096, 0, OutType::F32, 1.0f};  // dW-like: long K, split-K candidate
  const auto a = run_case(gemm, c, false), b = run_case(gemm, c, false);
  EXPECT_TRUE(bitwise_equal(a, b));
  EXPECT_EQ(gemm.cached_algorithms(), 1u);
}

// Argument checks come before any CUDA call; with a device the wrapper is constructed first.
TEST(CudaGemm, RejectsBadLeadingDimension) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  Gemm gemm;
  EXPECT_THROW(
      gemm.matmul(Op::N, Op::N, 4, 4, 8, 1.0f, nullptr, 4, nullptr, 4, 0.0f, nullptr, OutType::F32, 4),
      std::invalid_argument);
}
