// GEMM wrappers and linear: every transpose combination against a naive float64 loop (with padded
// leading dimensions), strided batched GEMM, validation errors, and linear fwd/bwd against PyTorch
// (tests/golden/kernels/dense.json) and float64 finite differences.
#include <gtest/gtest.h>

#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/gradcheck.h"
#include "kernels_util.h"

using namespace olmosft;

namespace {
// C = alpha op(A) op(B) + beta C in float64, element by element.
template <typename T>
std::vector<double> naive(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, double alpha,
                          const std::vector<T>& A, int64_t lda, const std::vector<T>& B, int64_t ldb,
                          double beta, const std::vector<T>& C, int64_t ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        double a = ta == Trans::N ? A[i * lda + k] : A[k * lda + i];
        double b = tb == Trans::N ? B[k * ldb + j] : B[j * ldb + k];
        s += a * b;
      }
      out[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * double(C[i * ldc + j]));
    }
  return out;
}

template <typename T>
void check_all_transposes(double tol) {
  const int64_t M = 5, N = 7, K = 9;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      // Padded leading dimensions (+3) catch lda/ldb/ldc mix-ups.
      const int64_t lda = (ta == Trans::N ? K : M) + 3, ldb = (tb == Trans::N ? N : K) + 3, ldc = N + 3;
      auto A = kt::randn<T>(size_t((ta == Trans::N ? M : K) * lda), 1);
      auto B = kt::randn<T>(size_t((tb == Trans::N ? K : N) * ldb), 2);
      auto C = kt::randn<T>(size_t(M * ldc), 3);
      auto ref = naive(ta, tb, M, N, K, 0.5, A, lda, B, ldb, 2.0, C, ldc);
      gemm<T>(ta, tb, M, N, K, T(0.5), A.data(), lda, B.data(), ldb, T(2.0), C.data(), ldc);
      EXPECT_LT(kt::max_abs(C, ref), tol) << "ta=" << int(ta) << " tb=" << int(tb);
    }
}
}  // namespace

// Tolerances: K=9 products of O(1) values; float accumulates ~K * 2^-24 * |terms| ~ 1e-6, so 1e-5.
// double: 1e-13.
TEST(KernelsGemm, AllTransposesFloat) { check_all_transposes<float>(1e-5); }
TEST(KernelsGemm, AllTransposesDouble) { check_all_transposes<double>(1e-13); }

TEST(KernelsGemm, BetaZeroIgnoresNaNAndKZero) {
  std::vector<float> A(6, 1.f), B(6, 1.f), C(4, NAN);
  gemm<float>(Trans::N, Trans::N, 2, 2, 3, 1.f, A.data(), 3, B.data(), 2, 0.f, C.data(), 2);
  for (float c : C) EXPECT_EQ(c, 3.f);
  // K = 0: C = beta * C (BLAS would reject lda = 0).
  gemm<float>(Trans::N, Trans::N, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
  for (float c : C) EXPECT_EQ(c, 1.5f);
}

TEST(KernelsGemm, StridedBatchedMatchesLoopAndBroadcasts) {
  const int64_t M = 4, N = 3, K = 6, batch = 5;
  auto A = kt::randn<double>(size_t(batch * M * K), 4);
  auto B = kt::randn<double>(size_t(K * N), 5);  // broadcast: stride_b = 0
  std::vector<double> C(size_t(batch * M * N + 7), 0.0);
  gemm_strided_batched<double>(Trans::N, Trans::N, M, N, K, 1.0, A.data(), K, M * K, B.data(), N, 0, 0.0,
                               C.data(), N, M * N + 1,
                               batch - 1);  // stride_c with a gap; only batch-1 batches
  for (int64_t b = 0; b < batch - 1; ++b) {
    std::vector<double> Ab(A.begin() + b * M * K, A.begin() + (b + 1) * M * K), Cb(size_t(M * N), 0.0);
    auto ref = naive(Trans::N, Trans::N, M, N, K, 1.0, Ab, K, B, N, 0.0, Cb, N);
    std::vector<double> got(C.begin() + b * (M * N + 1), C.begin() + b * (M * N + 1) + M * N);
    EXPECT_LT(kt::max_abs(got, ref), 1e-13) << "batch " << b;
  }
  // The gap element between batches is untouched.
  EXPECT_EQ(C[size_t(M * N)], 0.0);
  EXPECT_THROW(gemm_strided_batched<double>(Trans::N, Trans::N, M, N, K, 1.0, A.data(), K, M * K, B.data(), N,
                                            0, 0.0, C.data(), N, M * N - 1, 2),
               Error);
}

TEST(KernelsGemm, ValidationErrors) {
  std::vector<float> A(100), B(100), C(100);
  EXPECT_THROW(gemm<float>(Trans::N, Trans::N, 4, 4, 5, 1.f, A.data(), 4, B.data(), 4, 0.f, C.data(), 4),
               Error);
  EXPECT_THROW(gemm<float>(Trans::T, Trans::N, 4, 4, 5, 1.f, A.data(), 3, B.data(), 4, 0.f, C.data(), 4),
               Error);
  EXPECT_THROW(gemm<float>(Trans::N, Trans::T, 4, 4, 5, 1.f, A.data(), 5, B.data(), 4, 0.f, C.data(), 4),
               Error);
  EXPECT_THROW(gemm<float>(Trans::N, Trans::N, 4, 4, 5, 1.f, A.data(), 5, B.data(), 4, 0.f, C.data(), 3),
               Error);
  EXPECT_THROW(gemm<float>(Trans::N, Trans::N, -1, 4, 5, 1.f, A.data(), 5, B.data(), 4, 0.f, C.data(), 4),
               Error);
  try {
    gemm<float>(Trans::N, Trans::N, 4, 4, 5, 1.f, A.data(), 4, B.data(), 4, 0.f, C.data(), 4);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lda=4"), std::string::npos) << e.what();
  }
  Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({5, 2}), c = Tensor::zeros({3, 2});
  EXPECT_THROW(gemm(Trans::N, Trans::N, 1.f, a, b, 0.f, c), Error);  // inner dims 4 vs 5
  Tensor bi = Tensor::zeros({4, 2}, DType::I32);
  EXPECT_THROW(gemm(Trans::N, Trans::N, 1.f, a, bi, 0.f, c), Error);
  Tensor x = Tensor::zeros({2, 3}), W = Tensor::zeros({4, 5}), y = Tensor::zeros({2, 4});
  EXPECT_THROW(linear_forward(x, W, y), Error);
}

TEST(KernelsGemm, TensorOverloadWithRowSlicesAndTransposedViews) {
  // A is a column slice of a wider matrix (lda > cols); B is given transposed.
  Tensor big = Tensor::from(kt::randn<float>(6 * 10, 7), {6, 10});
  Tensor A = big.slice(1, 2, 7);  // [6, 5] with row stride 10
  Tensor B = Tensor::from(kt::randn<float>(4 * 5, 8), {4, 5});
  Tensor C = Tensor::zeros({6, 4});
  gemm(Trans::N, Trans::T, 1.f, A, B, 0.f, C);
  std::vector<float> a(30), bb(B.data<float>(), B.data<float>() + 20), c(24, 0.f);
  for (int i = 0; i < 6; ++i)
    for (int k = 0; k < 5; ++k) a[size_t(i * 5 + k)] = big.data<float>()[i * 10 + 2 + k];
  auto ref = naive(Trans::N, Trans::T, 6, 4, 5, 1.0, a, 5, bb, 5, 0.0, c, 4);
  std::vector<float> got(C.data<float>(), C.data<float>() + 24);
  EXPECT_LT(kt::max_abs(got, ref), 1e-5);
}

// Linear vs PyTorch (float64 autograd on float32 inputs). float tolerance: in=12 / out=5 term sums of
// O(1) values, |error| <~ 1e-6; 1e-5 relative. double: 1e-12.
template <typename T>
void linear_vs_torch(double tol) {
  auto f = kt::load_fixture("dense.json")["linear"];
  const int64_t N = f["N"], in = f["in"], out = f["out"];
  auto x = kt::vec<T>(f["x"]), W = kt::vec<T>(f["W"]), dy = kt::vec<T>(f["dy"]);
  std::vector<T> y(size_t(N * out)), dx(size_t(N * in)), dW(size_t(out * in), T(0));
  linear_forward<T>(x.data(), W.data(), y.data(), N, in, out);
  linear_backward<T>(dy.data(), x.data(), W.data(), dx.data(), dW.data(), N, in, out);
  EXPECT_LT(kt::max_rel(y, kt::vec<double>(f["y"])), tol);
  EXPECT_LT(kt::max_rel(dx, kt::vec<double>(f["dx"])), tol);
  EXPECT_LT(kt::max_rel(dW, kt::vec<double>(f["dW"])), tol);
  // dW accumulates; dx is overwritten unless accumulate_dx.
  linear_backward<T>(dy.data(), x.data(), W.data(), dx.data(), dW.data(), N, in, out);
  auto dW2 = kt::vec<double>(f["dW"]);
  for (auto& v : dW2) v *= 2;
  EXPECT_LT(kt::max_rel(dW, dW2), tol);
  EXPECT_LT(kt::max_rel(dx, kt::vec<double>(f["dx"])), tol);
  linear_backward<T>(dy.data(), x.data(), W.data(), dx.data(), nullptr, N, in, out, /*accumulate_dx=*/true);
  auto dx2 = kt::vec<double>(f["dx"]);
  for (auto& v : dx2) v *= 2;
  EXPECT_LT(kt::max_rel(dx, dx2), tol);
}
TEST(KernelsGemm, LinearVsTorchFloat) { linear_vs_torch<float>(1e-5); }
TEST(KernelsGemm, LinearVsTorchDouble) { linear_vs_torch<double>(1e-12); }

TEST(KernelsGemm, LinearTensorOverloadAndFiniteDifferences) {
  const int64_t B = 2, T = 3, in = 6, out = 4;
  auto xv = kt::randn<double>(size_t(B * T * in), 9), Wv = kt::randn<double>(size_t(out * in), 10, 0.5);
  auto r = kt::randn<double>(size_t(B * T * out), 11);
  Tensor x = Tensor::from(xv, {B, T, in}), W = Tensor::from(Wv, {out, in}),
         y = Tensor::zeros({B, T, out}, DType::F64);
  auto loss = [&] {
    linear_forward(x, W, y);
    return kt::dot(std::vector<double>(y.data<double>(), y.data<double>() + y.numel()), r);
  };
  Tensor dy = Tensor::from(r, {B, T, out}), dx = Tensor::zeros({B, T, in}, DType::F64),
         dW = Tensor::zeros({out, in}, DType::F64);
  linear_backward(dy, x, W, dx, dW);
  double e1 = fd_max_rel_err(loss, x.data<double>(), x.numel(), dx.data<double>());
  double e2 = fd_max_rel_err(loss, W.data<double>(), W.numel(), dW.data<double>());
  // float64 central differences, h = 1e-5: the loss is bilinear, so only rounding (~1e-10) remains.
  EXPECT_LT(e1, 1e-8);
  EXPECT_LT(e2, 1e-8);
  // Float vs double through the same code.
  Tensor xf = x.to(DType::F32), Wf = W.to(DType::F32), yf = Tensor::zeros({B, T, out});
  linear_forward(xf, Wf, yf);
  linear_forward(x, W, y);  // the FD loop left y at a perturbed point
  // float inputs are rounded (2^-24 relative); |y| ~ 3 with 6-term sums: |error| ~ 1e-6.
  EXPECT_LT(max_abs_diff(yf.to(DType::F64), y), 1e-5);
}
