// The CPU GEMM set-ups (kernels/gemm.h CpuGemm): oneDNN's fp32 matmul and the bf16 compute path against
// float64 loops, every transpose with padded leading dimensions; bf16 within its rounding bound of the fp32
// product; repeatability bit for bit; Precision::Exact and double untouched by bf16; validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#include "kernels_util.h"

using namespace olmosft;

namespace {

struct Case {
  Trans ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  std::vector<float> A, B, C;
  Case(Trans ta_, Trans tb_, int64_t M_, int64_t N_, int64_t K_, uint64_t seed)
      : ta(ta_), tb(tb_), M(M_), N(N_), K(K_) {
    // Padded leading dimensions (+3) catch lda/ldb/ldc mix-ups.
    lda = (ta == Trans::N ? K : M) + 3;
    ldb = (tb == Trans::N ? N : K) + 3;
    ldc = N + 3;
    A = kt::randn<float>(size_t((ta == Trans::N ? M : K) * lda), seed);
    B = kt::randn<float>(size_t((tb == Trans::N ? K : N) * ldb), seed + 1);
    C = kt::randn<float>(size_t(M * ldc), seed + 2);
  }
  float a(int64_t i, int64_t k) const {
    return ta == Trans::N ? A[size_t(i * lda + k)] : A[size_t(k * lda + i)];
  }
  float b(int64_t k, int64_t j) const {
    return tb == Trans::N ? B[size_t(k * ldb + j)] : B[size_t(j * ldb + k)];
  }
  // alpha op(A) op(B) + beta C in float64, operands through `seen`; also sum |alpha a b| per element.
  template <typename F>
  std::vector<double> reference(double alpha, double beta, F seen,
                                std::vector<double>* abs_sum = nullptr) const {
    std::vector<double> out(C.begin(), C.end());
    if (abs_sum) abs_sum->assign(out.size(), 0.0);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0, sa = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = double(seen(a(i, k))) * double(seen(b(k, j)));
          s += p;
          sa += std::fabs(double(a(i, k)) * double(b(k, j)));
        }
        out[size_t(i * ldc + j)] = alpha * s + (beta == 0 ? 0.0 : beta * double(C[size_t(i * ldc + j)]));
        if (abs_sum) (*abs_sum)[size_t(i * ldc + j)] = std::fabs(alpha) * sa;
      }
    return out;
  }
  std::vector<float> run(const CpuGemm& g, float alpha, float beta, Precision p = Precision::Compute) const {
    ScopedCpuGemm use(g);
    std::vector<float> c = C;
    gemm_compute<float>(p, ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, c.data(), ldc);
    return c;
  }
};

float identity(float x) { return x; }
float rounded(float x) { return bf16_to_f32(f32_to_bf16(x)); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool bf16_here() {
  std::string why;
  return onednn_bf16_supported(&why);
}

}  // namespace

// Tolerance: K <= 70 products of O(1) values summed in fp32: ~K * 2^-24 * sum|terms| < 1e-5.
TEST(KernelsGemmCpu, OneDnnFp32AllTransposesAgainstFloat64) {
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (float beta : {0.0f, 1.0f, 2.0f}) {
        const Case c(ta, tb, 13, 17, 70, 5);
        const auto got = c.run({GemmLib::OneDNN, ComputeDtype::F32}, 0.5f, beta);
        EXPECT_LT(kt::max_abs(got, c.reference(0.5, beta, identity)), 1e-5)
            << "ta=" << int(ta) << " tb=" << int(tb) << " beta=" << beta;
        // Padding between rows of C is never written.
        for (int64_t i = 0; i < c.M; ++i)
          for (int64_t j = c.N; j < c.ldc; ++j)
            EXPECT_EQ(got[size_t(i * c.ldc + j)], c.C[size_t(i * c.ldc + j)]);
      }
}

// bf16 compute: the result is the fp32 sum of the products of the bf16-rounded operands (tolerance as above),
// and it is within the rounding bound of the unrounded product: each operand moves by at most 2^-9 of itself,
// so each product by at most (2^-9 + 2^-9 + 2^-18) of |a b|; bound 2^-8 * sum|a b| + 1e-5. It is not the fp32
// result (the rounding is really applied).
TEST(KernelsGemmCpu, Bf16ComputeIsTheFp32SumOfRoundedOperandsWithinTheRoundingBound) {
  if (!bf16_here()) GTEST_SKIP() << "skipped: this CPU has no oneDNN bf16 matmul";
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (float beta : {0.0f, 1.0f}) {
        const Case c(ta, tb, 19, 23, 61, 9);
        const auto got = c.run({GemmLib::OpenBLAS, ComputeDtype::BF16}, 1.0f, beta);
        EXPECT_LT(kt::max_abs(got, c.reference(1.0, beta, rounded)), 1e-5)
            << "ta=" << int(ta) << " tb=" << int(tb) << " beta=" << beta;
        std::vector<double> abs_sum;
        const auto exact = c.reference(1.0, beta, identity, &abs_sum);
        double worst = 0;
        for (size_t i = 0; i < exact.size(); ++i)
          worst = std::max(worst, std::fabs(got[i] - exact[i]) / (std::ldexp(abs_sum[i], -8) + 1e-5));
        EXPECT_LE(worst, 1.0) << "ta=" << int(ta) << " tb=" << int(tb);
        EXPECT_FALSE(same_bits(got, c.run({GemmLib::OpenBLAS, ComputeDtype::F32}, 1.0f, beta)));
      }
}

// Same operands, same thread count: the same bits, for each set-up and at 1 and 2 threads (a shape large
// enough to be split across threads).
TEST(KernelsGemmCpu, EverySetUpRepeatsBitForBit) {
  const Case c(Trans::T, Trans::N, 300, 260, 520, 21);
  std::vector<CpuGemm> setups = {{GemmLib::OpenBLAS, ComputeDtype::F32},
                                 {GemmLib::OneDNN, ComputeDtype::F32}};
  if (bf16_here()) setups.push_back({GemmLib::OneDNN, ComputeDtype::BF16});
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_threads(threads);
    for (const CpuGemm& g : setups)
      EXPECT_TRUE(same_bits(c.run(g, 1.0f, 1.0f), c.run(g, 1.0f, 1.0f)))
          << gemm_lib_name(g.fp32) << " " << compute_dtype_name(g.compute) << " threads=" << threads;
  }
  set_threads(saved);
}

// A held weight (Bf16Weights) is read as its copy: the same bits as rounding B at the call, for B as the
// weight of linear_forward (T) and of its dx (N), with padded leading dimensions, and for a slice of a held
// weight (the LM head's vocabulary tiles). Only a range inside a held weight is read from the copy; released
// or unheld weights are rounded at the call as before.
TEST(KernelsGemmCpu, HeldBf16WeightsGiveTheSameBitsAsRoundingAtTheCall) {
  if (!bf16_here()) GTEST_SKIP() << "skipped: this CPU has no oneDNN bf16 matmul";
  for (Trans tb : {Trans::N, Trans::T}) {
    Case c(Trans::N, tb, 37, 45, 29, 41);
    const auto plain = c.run({GemmLib::OneDNN, ComputeDtype::BF16}, 1.0f, 1.0f);
    const int64_t extent = int64_t(c.B.size()) - 3;  // the last row's padding is not read
    Bf16Weights held;
    held.hold(7, {{c.B.data(), extent}});
    EXPECT_TRUE(held.holds(7));
    EXPECT_NE(held.find(c.B.data(), extent), nullptr);
    EXPECT_EQ(held.find(c.B.data(), extent + 1), nullptr);                       // too short for that extent
    EXPECT_EQ(held.find(c.B.data() + 5, 4), held.find(c.B.data(), extent) + 5);  // a slice (vocab tiles)
    EXPECT_EQ(held.find(c.B.data() + extent - 2, 3), nullptr);                   // past the end
    {
      const ScopedBf16Weights use(&held);
      EXPECT_TRUE(same_bits(c.run({GemmLib::OneDNN, ComputeDtype::BF16}, 1.0f, 1.0f), plain)) << int(tb);
      const float b0 = c.B[0];
      c.B[0] = b0 + 1.0f;  // the holder promised not to do this: the copy (rounded above) is still read
      EXPECT_TRUE(same_bits(c.run({GemmLib::OneDNN, ComputeDtype::BF16}, 1.0f, 1.0f), plain)) << int(tb);
      c.B[0] = b0;
    }
    {  // a GEMM over rows 3.. of B (tb = T: rows of B are op(B)'s columns; tb = N: K rows), held vs not
      const int64_t skip = 3 * c.ldb, rows = tb == Trans::T ? c.N - 3 : c.K - 3;
      auto sliced = [&](Bf16Weights* use) {
        const ScopedBf16Weights scope(use);
        const ScopedCpuGemm g({GemmLib::OneDNN, ComputeDtype::BF16});
        std::vector<float> out(size_t(c.M * c.ldc), 0.0f);
        const int64_t n = tb == Trans::T ? rows : c.N, k = tb == Trans::T ? c.K : rows;
        gemm_compute<float>(Precision::Compute, Trans::N, tb, c.M, n, k, 1.0f, c.A.data(), c.lda,
                            c.B.data() + skip, c.ldb, 0.0f, out.data(), c.ldc);
        return out;
      };
      EXPECT_TRUE(same_bits(sliced(&held), sliced(nullptr))) << "slice, tb=" << int(tb);
    }
    held.release(7, true);
    EXPECT_FALSE(held.holds(7));
    EXPECT_EQ(held.find(c.B.data(), 1), nullptr);
    const ScopedBf16Weights use(&held);
    EXPECT_TRUE(same_bits(c.run({GemmLib::OneDNN, ComputeDtype::BF16}, 1.0f, 1.0f), plain)) << int(tb);
  }
}

// The router's GEMMs (Precision::Exact) and every double GEMM ignore compute=bf16: the fp32 library's bits.
TEST(KernelsGemmCpu, ExactPrecisionAndDoubleIgnoreBf16) {
  if (!bf16_here()) GTEST_SKIP() << "skipped: this CPU has no oneDNN bf16 matmul";
  const Case c(Trans::N, Trans::T, 11, 7, 29, 33);
  EXPECT_TRUE(same_bits(c.run({GemmLib::OpenBLAS, ComputeDtype::BF16}, 1.0f, 0.0f, Precision::Exact),
                        c.run({GemmLib::OpenBLAS, ComputeDtype::F32}, 1.0f, 0.0f)));
  const std::vector<double> A(c.A.begin(), c.A.end()), B(c.B.begin(), c.B.end());
  std::vector<double> y16(size_t(c.M * c.N)), y32(y16.size());
  {
    ScopedCpuGemm use({GemmLib::OpenBLAS, ComputeDtype::BF16});
    linear_forward<double>(A.data(), B.data(), y16.data(), c.M, c.K, c.N);
  }
  linear_forward<double>(A.data(), B.data(), y32.data(), c.M, c.K, c.N);
  EXPECT_EQ(y16, y32);
}

// linear_backward under bf16: dx and dW within the rounding bound of fp32's, dW accumulated (+=).
TEST(KernelsGemmCpu, Bf16LinearBackwardAccumulatesWithinTheBound) {
  if (!bf16_here()) GTEST_SKIP() << "skipped: this CPU has no oneDNN bf16 matmul";
  const int64_t N = 40, in = 24, out = 16;
  const auto x = kt::randn<float>(size_t(N * in), 41), W = kt::randn<float>(size_t(out * in), 42),
             dy = kt::randn<float>(size_t(N * out), 43);
  std::vector<float> dx16(size_t(N * in)), dW16(size_t(out * in), 1.0f), dx32 = dx16, dW32 = dW16;
  {
    ScopedCpuGemm use({GemmLib::OpenBLAS, ComputeDtype::BF16});
    linear_backward<float>(dy.data(), x.data(), W.data(), dx16.data(), dW16.data(), N, in, out);
  }
  linear_backward<float>(dy.data(), x.data(), W.data(), dx32.data(), dW32.data(), N, in, out);
  // |terms| ~ 1 each, N = 40 terms: 2^-8 * 40 * E|ab| (~0.64) ~ 0.1 bound on dW; out = 16 terms on dx.
  EXPECT_LT(kt::max_abs(dW16, dW32), std::ldexp(40.0, -8));
  EXPECT_LT(kt::max_abs(dx16, dx32), std::ldexp(16.0, -8));
  EXPECT_GT(kt::max_abs(dW16, dW32), 0.0);
}

TEST(KernelsGemmCpu, ParseErrorsNameTheKeyAndTheChoices) {
  EXPECT_EQ(parse_gemm_lib("openblas", "k"), GemmLib::OpenBLAS);
  EXPECT_EQ(parse_gemm_lib("onednn", "k"), GemmLib::OneDNN);
  EXPECT_EQ(parse_gemm_lib("auto", "k"), auto_gemm_lib());
  EXPECT_EQ(parse_compute_dtype("bf16", "k"), ComputeDtype::BF16);
  try {
    parse_gemm_lib("mkl", "recipe.yaml: compute.gemm");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("recipe.yaml: compute.gemm: expected auto, openblas or onednn, got 'mkl'"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_compute_dtype("fp16", "compute.dtype"), Error);
  EXPECT_NE(gemm_description().find("oneDNN"), std::string::npos);
}
