// RMSNorm and SwiGLU: forward/backward against PyTorch (tests/golden/kernels/dense.json), float64 finite
// differences, float vs double through the same template, and thread-count invariance of dw.
#include <gtest/gtest.h>

#include "core/tensor.h"
#include "core/threads.h"
#include "kernels/gradcheck.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"
#include "kernels_util.h"

using namespace olmosft;

// Tolerances vs torch (float64 reference on the same float32 inputs): the float path rounds each op to
// 2^-24 (6e-8) relative, D=16 sums; 2e-6 relative to the output's scale. The double path: 1e-12.
template <typename T>
void rmsnorm_vs_torch(const char* key, double tol) {
  auto f = kt::load_fixture("dense.json")[key];
  const int64_t N = f["N"], D = f["D"];
  const double eps = f["eps"];
  const bool has_w = f.contains("w");
  auto x = kt::vec<T>(f["x"]), dy = kt::vec<T>(f["dy"]);
  std::vector<T> w = has_w ? kt::vec<T>(f["w"]) : std::vector<T>{};
  std::vector<T> y(static_cast<size_t>(N * D)), rstd(static_cast<size_t>(N)), dx(static_cast<size_t>(N * D)),
      dw(static_cast<size_t>(D), T(0));
  rmsnorm_forward<T>(x.data(), has_w ? w.data() : nullptr, y.data(), rstd.data(), N, D, eps);
  rmsnorm_backward<T>(dy.data(), x.data(), has_w ? w.data() : nullptr, rstd.data(), dx.data(),
                      has_w ? dw.data() : nullptr, N, D, eps);
  EXPECT_LT(kt::max_rel(y, kt::vec<double>(f["y"])), tol) << key;
  EXPECT_LT(kt::max_rel(dx, kt::vec<double>(f["dx"])), tol) << key;
  if (has_w) {
    EXPECT_LT(kt::max_rel(dw, kt::vec<double>(f["dw"])), tol) << key;
  }
  // rstd == nullptr recomputes r: identical result.
  std::vector<T> dx2(dx.size());
  rmsnorm_backward<T>(dy.data(), x.data(), has_w ? w.data() : nullptr, nullptr, dx2.data(), nullptr, N, D,
                      eps);
  EXPECT_EQ(kt::max_abs(dx, dx2), 0.0);
}
TEST(KernelsRmsnorm, VsTorchWeightFloat) { rmsnorm_vs_torch<float>("rmsnorm_w", 2e-6); }
TEST(KernelsRmsnorm, VsTorchWeightDouble) { rmsnorm_vs_torch<double>("rmsnorm_w", 1e-12); }
TEST(KernelsRmsnorm, VsTorchNoWeightFloat) { rmsnorm_vs_torch<float>("rmsnorm_now", 2e-6); }
TEST(KernelsRmsnorm, VsTorchNoWeightDouble) { rmsnorm_vs_torch<double>("rmsnorm_now", 1e-12); }

// Grouped gains (the per-head q/k norm): row i uses gains w + (i % G) * D. Each row's output and dx equal the
// plain kernel's on that row with its group's gains, bit for bit (the same per-row arithmetic); dw per group
// equals the sum of the per-row calls' dw within float64 rounding of the fixed-block partial sums (1e-12).
TEST(KernelsRmsnorm, GroupedGainsEqualPerRowCalls) {
  const int64_t N = 37, G = 3, D = 8;
  const double eps = 1e-6;
  auto x = kt::randn<double>(static_cast<size_t>(N * D), 11, 0.9), dy = kt::randn<double>(x.size(), 12);
  auto w = kt::randn<double>(static_cast<size_t>(G * D), 13, 0.5);
  std::vector<double> y(x.size()), rs(static_cast<size_t>(N)), dx(x.size()), dw(w.size(), 0.0);
  rmsnorm_forward_grouped<double>(x.data(), w.data(), G, y.data(), rs.data(), N, D, eps);
  rmsnorm_backward_grouped<double>(dy.data(), x.data(), w.data(), G, rs.data(), dx.data(), dw.data(), N, D,
                                   eps);
  std::vector<double> y1(static_cast<size_t>(D)), dx1(static_cast<size_t>(D)), dw1(w.size(), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const double* wi = w.data() + (i % G) * D;
    double r1 = 0;
    rmsnorm_forward<double>(x.data() + i * D, wi, y1.data(), &r1, 1, D, eps);
    rmsnorm_backward<double>(dy.data() + i * D, x.data() + i * D, wi, &r1, dx1.data(),
                             dw1.data() + (i % G) * D, 1, D, eps);
    EXPECT_EQ(r1, rs[static_cast<size_t>(i)]);
    for (int64_t j = 0; j < D; ++j) {
      EXPECT_EQ(y1[static_cast<size_t>(j)], y[static_cast<size_t>(i * D + j)]) << i << "," << j;
      EXPECT_EQ(dx1[static_cast<size_t>(j)], dx[static_cast<size_t>(i * D + j)]) << i << "," << j;
    }
  }
  EXPECT_LT(kt::max_rel(dw, dw1), 1e-12);
  // G = 1 is the plain kernel
  std::vector<double> yp(x.size()), yg(x.size());
  rmsnorm_forward<double>(x.data(), w.data(), yp.data(), nullptr, N, D, eps);
  rmsnorm_forward_grouped<double>(x.data(), w.data(), 1, yg.data(), nullptr, N, D, eps);
  EXPECT_EQ(kt::max_abs(yp, yg), 0.0);
}

TEST(KernelsRmsnorm, FiniteDifferencesFloat64) {
  for (bool weight : {true, false})
    for (double eps : {1e-6, 0.5}) {  // a large eps makes the eps term visible in the gradient
      const int64_t N = 5, D = 24;
      auto x = kt::randn<double>(static_cast<size_t>(N * D), 1, 0.7),
           w = kt::randn<double>(static_cast<size_t>(D), 2, 0.5);
      auto r = kt::randn<double>(static_cast<size_t>(N * D), 3);
      std::vector<double> y(x.size()), dx(x.size()), dw(static_cast<size_t>(D), 0.0);
      const double* wp = weight ? w.data() : nullptr;
      auto loss = [&] {
        rmsnorm_forward<double>(x.data(), wp, y.data(), nullptr, N, D, eps);
        return kt::dot(y, r);
      };
      rmsnorm_backward<double>(r.data(), x.data(), wp, nullptr, dx.data(), weight ? dw.data() : nullptr, N, D,
                               eps);
      // float64 central differences, h = 1e-5: truncation ~h^2 f''' ~ 1e-10 relative.
      EXPECT_LT(fd_max_rel_err(loss, x.data(), N * D, dx.data()), 1e-7) << weight << " " << eps;
      if (weight) {
        EXPECT_LT(fd_max_rel_err(loss, w.data(), D, dw.data()), 1e-7) << eps;
      }
    }
}

TEST(KernelsRmsnorm, FloatMatchesDoubleAndDwThreadInvariant) {
  const int64_t N = 37, D = 256;
  auto xd = kt::randn<double>(static_cast<size_t>(N * D), 4, 3.0),
       wd = kt::randn<double>(static_cast<size_t>(D), 5),
       dyd = kt::randn<double>(static_cast<size_t>(N * D), 6);
  std::vector<float> xf(xd.begin(), xd.end()), wf(wd.begin(), wd.end()), dyf(dyd.begin(), dyd.end());
  std::vector<double> y(xd.size()), dx(xd.size()), dw(static_cast<size_t>(D), 0.0);
  rmsnorm_forward<double>(xd.data(), wd.data(), y.data(), nullptr, N, D, 1e-6);
  rmsnorm_backward<double>(dyd.data(), xd.data(), wd.data(), nullptr, dx.data(), dw.data(), N, D, 1e-6);
  const int saved = num_threads();
  std::vector<std::vector<float>> dws;
  for (int t : {1, 2}) {
    set_threads(t);
    std::vector<float> yf(xf.size()), dxf(xf.size()), dwf(static_cast<size_t>(D), 0.f);
    rmsnorm_forward<float>(xf.data(), wf.data(), yf.data(), nullptr, N, D, 1e-6);
    rmsnorm_backward<float>(dyf.data(), xf.data(), wf.data(), nullptr, dxf.data(), dwf.data(), N, D, 1e-6);
    // Inputs are the same float-representable values (kt::randn rounds through float), so the only
    // differences are float rounding of each op: ~1e-7 relative; 1e-5 leaves margin for D=256 sums.
    EXPECT_LT(kt::max_rel(yf, y), 1e-6);
    EXPECT_LT(kt::max_rel(dxf, dx), 1e-5);
    EXPECT_LT(kt::max_rel(dwf, dw), 1e-5);
    dws.push_back(dwf);
  }
  set_threads(saved);
  EXPECT_EQ(kt::max_abs(dws[0], dws[1]), 0.0) << "dw must not depend on the thread count";
}

TEST(KernelsRmsnorm, TensorOverloadChecksShapes) {
  Tensor x = Tensor::from(kt::randn<float>(12, 7), {2, 2, 3}), y = Tensor::zeros({2, 2, 3}),
         w = Tensor::zeros({3});
  Tensor rstd = Tensor::zeros({4}), none;
  w.fill(1.f);
  rmsnorm_forward(x, w, y, rstd, 1e-6);
  double ss = 0;
  for (int j = 0; j < 3; ++j) ss += double(x.data<float>()[j]) * x.data<float>()[j];
  EXPECT_NEAR(y.data<float>()[0], x.data<float>()[0] / std::sqrt(ss / 3 + 1e-6), 1e-6);
  Tensor bad_w = Tensor::zeros({4});
  EXPECT_THROW(rmsnorm_forward(x, bad_w, y, none, 1e-6), Error);
  Tensor bad_y = Tensor::zeros({2, 6});
  EXPECT_THROW(rmsnorm_forward(x, w, bad_y, none, 1e-6), Error);
  EXPECT_THROW(rmsnorm_forward(x, w, y, none, -1.0), Error);
}

template <typename T>
void swiglu_vs_torch(double tol) {
  auto f = kt::load_fixture("dense.json")["swiglu"];
  const int64_t n = f["n"];
  auto a = kt::vec<T>(f["a"]), b = kt::vec<T>(f["b"]), dh = kt::vec<T>(f["dh"]);
  std::vector<T> h(static_cast<size_t>(n)), da(static_cast<size_t>(n)), db(static_cast<size_t>(n));
  swiglu_forward<T>(a.data(), b.data(), h.data(), n);
  swiglu_backward<T>(dh.data(), a.data(), b.data(), da.data(), db.data(), n);
  EXPECT_LT(kt::max_rel(h, kt::vec<double>(f["h"])), tol);
  EXPECT_LT(kt::max_rel(da, kt::vec<double>(f["da"])), tol);
  EXPECT_LT(kt::max_rel(db, kt::vec<double>(f["db"])), tol);
}
// float: exp and a few products, each ~1 ulp: 1e-6 relative to scale. double: 1e-13.
TEST(KernelsSwiglu, VsTorchFloat) { swiglu_vs_torch<float>(1e-6); }
TEST(KernelsSwiglu, VsTorchDouble) { swiglu_vs_torch<double>(1e-13); }

TEST(KernelsSwiglu, FiniteDifferencesFloat64AndStridedLayout) {
  // Fused [N, 2F] gate|up layout: a = p, b = p + F, ld = 2F; outputs [N, F].
  const int64_t N = 3, F = 10;
  auto p = kt::randn<double>(static_cast<size_t>(N * 2 * F), 7, 4.0),
       r = kt::randn<double>(static_cast<size_t>(N * F), 8);
  std::vector<double> h(static_cast<size_t>(N * F)), dp(p.size(), 0.0);
  auto loss = [&] {
    swiglu_forward<double>(p.data(), 2 * F, p.data() + F, 2 * F, h.data(), F, N, F);
    return kt::dot(h, r);
  };
  swiglu_backward<double>(r.data(), F, p.data(), 2 * F, p.data() + F, 2 * F, dp.data(), 2 * F, dp.data() + F,
                          2 * F, N, F);
  EXPECT_LT(fd_max_rel_err(loss, p.data(), int64_t(p.size()), dp.data()), 1e-7);
  // Large |a| saturates without NaN: silu(-100) ~ -0, silu(100) = 100.
  std::vector<float> a = {-100.f, 100.f, 0.f}, b = {1.f, 1.f, 1.f}, hh(3), da(3), db(3), g = {1.f, 1.f, 1.f};
  swiglu_forward<float>(a.data(), b.data(), hh.data(), 3);
  swiglu_backward<float>(g.data(), a.data(), b.data(), da.data(), db.data(), 3);
  EXPECT_NEAR(hh[0], 0.f, 1e-30);
  EXPECT_EQ(hh[1], 100.f);
  EXPECT_EQ(hh[2], 0.f);
  EXPECT_EQ(da[2], 0.5f);  // d silu / da at 0 = 1/2
  for (float v : da) EXPECT_TRUE(std::isfinite(v));
}

TEST(KernelsSwiglu, FloatMatchesDoubleLarge) {
  const int64_t n = 100000;  // parallel_for splits this across threads
  auto a = kt::randn<double>(static_cast<size_t>(n), 9, 3.0),
       b = kt::randn<double>(static_cast<size_t>(n), 10), g = kt::randn<double>(static_cast<size_t>(n), 11);
  std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), gf(g.begin(), g.end()),
      hf(static_cast<size_t>(n)), daf(static_cast<size_t>(n)), dbf(static_cast<size_t>(n));
  std::vector<double> h(static_cast<size_t>(n)), da(static_cast<size_t>(n)), db(static_cast<size_t>(n));
  swiglu_forward<double>(a.data(), b.data(), h.data(), n);
  swiglu_backward<double>(g.data(), a.data(), b.data(), da.data(), db.data(), n);
  swiglu_forward<float>(af.data(), bf.data(), hf.data(), n);
  swiglu_backward<float>(gf.data(), af.data(), bf.data(), daf.data(), dbf.data(), n);
  EXPECT_LT(kt::max_rel(hf, h), 1e-6);
  EXPECT_LT(kt::max_rel(daf, da), 1e-6);
  EXPECT_LT(kt::max_rel(dbf, db), 1e-6);
}
