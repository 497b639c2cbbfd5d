// Global-norm clipping + AdamW against torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW (five steps,
// weight decay on one tensor and off on the other; the first two steps clip), plus validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "kernels/adamw.h"
#include "kernels_util.h"

using namespace olmosft;

template <typename T>
void vs_torch(double tol) {
  auto f = kt::load_fixture("adamw.json");
  AdamWConfig cfg;
  cfg.lr = f["lr"];
  cfg.beta1 = f["beta1"];
  cfg.beta2 = f["beta2"];
  cfg.eps = f["eps"];
  cfg.weight_decay = f["weight_decay"];
  const double max_norm = f["max_norm"];
  std::vector<std::vector<T>> p, g, m, v;
  for (int k = 0; k < 2; ++k) {
    p.push_back(kt::vec<T>(f["init"][k]));
    g.emplace_back(p.back().size());
    m.emplace_back(p.back().size(), T(0));
    v.emplace_back(p.back().size(), T(0));
  }
  std::vector<AdamWParam<T>> ps;
  for (int k = 0; k < 2; ++k)
    ps.push_back({p[size_t(k)].data(), g[size_t(k)].data(), m[size_t(k)].data(), v[size_t(k)].data(),
                  int64_t(p[size_t(k)].size()), f["decay"][k].get<bool>()});
  double worst_p = 0, worst_mv = 0;
  int64_t step = 0;
  for (const auto& st : f["steps"]) {
    ++step;
    for (int k = 0; k < 2; ++k) g[size_t(k)] = kt::vec<T>(st["grads"][k]);
    for (int k = 0; k < 2; ++k) ps[size_t(k)].g = g[size_t(k)].data();
    const double norm = clip_grad_norm(ps, max_norm);
    EXPECT_NEAR(norm / st["norm"].get<double>(), 1.0, 1e-6) << "step " << step;
    adamw_step(ps, cfg, step);
    for (int k = 0; k < 2; ++k) {
      // Parameters: compare the change relative to lr (each step moves p by about lr).
      worst_p = std::max(worst_p, kt::max_abs(p[size_t(k)], kt::vec<double>(st["params"][k])) / cfg.lr);
      worst_mv = std::max(worst_mv, kt::max_rel(m[size_t(k)], kt::vec<double>(st["m"][k])));
      worst_mv = std::max(worst_mv, kt::max_rel(v[size_t(k)], kt::vec<double>(st["v"][k])));
    }
  }
  EXPECT_LT(worst_p, tol);
  EXPECT_LT(worst_mv, tol);
  std::printf("[measured] %s: max |p - torch| / lr = %.1e, m/v rel %.1e over %lld steps\n",
              std::is_same_v<T, float> ? "float" : "double", worst_p, worst_mv, (long long)step);
}
// torch runs in float32; our float path uses the same op order up to FMA contraction and the order of
// the g*g*(1-beta2) product (1 ulp per op). |p| ~ 1 so one float ulp is 1.2e-7 = 1.2e-5 lr; 1e-4 lr.
// The double path differs from torch's float32 by float rounding of torch itself: also 1e-4 lr.
TEST(KernelsAdamW, VsTorchFloat) { vs_torch<float>(1e-4); }
TEST(KernelsAdamW, VsTorchDouble) { vs_torch<double>(1e-4); }

TEST(KernelsAdamW, ClipSemanticsAndThreadInvariance) {
  std::vector<float> g1 = {3.f, 4.f}, g2 = {0.f}, dummy(2);
  std::vector<AdamWParam<float>> ps = {{dummy.data(), g1.data(), dummy.data(), dummy.data(), 2, true},
                                       {dummy.data(), g2.data(), dummy.data(), dummy.data(), 1, true}};
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 10.0), 5.0);  // no clipping below max_norm
  EXPECT_EQ(g1[0], 3.f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 1.0), 5.0);  // returns the pre-clip norm
  EXPECT_NEAR(g1[0], 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(g1[1], 4.0 / (5.0 + 1e-6), 1e-7);
  g1 = {3.f, 4.f};
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 0.0), 5.0);  // max_norm <= 0: measure only
  EXPECT_EQ(g1[1], 4.f);
  g1[0] = NAN;
  EXPECT_THROW(clip_grad_norm(ps, 1.0), Error);
  // Norm of a large tensor is identical for 1 and 2 threads (fixed blocking).
  auto big = kt::randn<float>(1 << 20, 5);
  std::vector<AdamWParam<float>> pb = {{nullptr, big.data(), nullptr, nullptr, int64_t(big.size()), true}};
  const int saved = num_threads();
  set_threads(1);
  const double n1 = global_grad_norm(pb);
  set_threads(2);
  const double n2 = global_grad_norm(pb);
  set_threads(saved);
  EXPECT_EQ(n1, n2);
  EXPECT_NEAR(n1 / std::sqrt(double(big.size())), 1.0, 0.01);
}

// The step over many tensors runs as one parallel region; it gives the bits of one call per tensor, and
// the norm is the sequential sum of each tensor's fixed blocks (64 at most, of at least 4,096 elements).
TEST(KernelsAdamW, ManyTensorsInOneRegionGiveTheBitsOfOneCallPerTensor) {
  const std::vector<int64_t> sizes = {3, 70000, 0, 4095, 300000, 17, 8192};
  auto make = [&](std::vector<std::vector<float>>& store) {
    std::vector<AdamWParam<float>> ps;
    store.clear();
    for (size_t t = 0; t < sizes.size(); ++t)
      for (int k = 0; k < 4; ++k) store.push_back(kt::randn<float>(size_t(sizes[t]), 100 + t * 4 + k));
    for (size_t t = 0; t < sizes.size(); ++t) {
      auto* q = &store[t * 4];
      for (auto& x : q[3]) x = x * x;  // v >= 0
      ps.push_back({q[0].data(), q[1].data(), q[2].data(), q[3].data(), sizes[t], t % 2 == 0});
    }
    return ps;
  };
  AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  std::vector<std::vector<float>> all, one;
  auto pa = make(all), po = make(one);
  double expect = 0;
  for (const auto& P : po) {
    const int64_t B = std::max<int64_t>(1, std::min<int64_t>(64, P.n / 4096));
    for (int64_t b = 0; b < B; ++b) {
      double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // element i of the block into lane i % 8
      for (int64_t i = P.n * b / B; i < P.n * (b + 1) / B; ++i)
        lane[(i - P.n * b / B) % 8] += double(P.g[i]) * double(P.g[i]);
      expect += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
  }
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_threads(threads);
    EXPECT_EQ(global_grad_norm(pa), std::sqrt(expect)) << threads;
  }
  set_threads(2);
  const double norm = global_grad_norm(pa);
  adamw_step(pa, cfg, 3, float(clip_coefficient(norm, 1.0)));  // the clip fused into the update
  const float coef = float(std::min(1.0, 1.0 / (norm + 1e-6)));
  for (auto& P : po) {
    for (int64_t i = 0; i < P.n; ++i) P.g[i] *= coef;
    std::vector<AdamWParam<float>> single = {P};
    adamw_step(single, cfg, 3);
  }
  set_threads(saved);
  ASSERT_LT(coef, 1.0f);  // the clip was exercised
  for (size_t i = 0; i < all.size(); ++i) {
    if (i % 4 == 1) continue;  // the gradients: scaled in place on one side only
    ASSERT_EQ(std::memcmp(all[i].data(), one[i].data(), all[i].size() * sizeof(float)), 0) << "buffer " << i;
  }
}

// sum_of_squares: within float64 rounding of the exact sum (long double, Kahan-compensated), for lengths
// around the 8-lane steps.
TEST(KernelsAdamW, SumOfSquaresIsTheDoubleSum) {
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 4096, 100003}) {
    const auto g = kt::randn<float>(size_t(n), 7 + uint64_t(n));
    long double sum = 0, comp = 0;
    for (float x : g) {
      const long double y = (long double)x * x - comp, t = sum + y;
      comp = (t - sum) - y;
      sum = t;
    }
    const double got = sum_of_squares(g.data(), n);
    EXPECT_LE(std::fabs(got - double(sum)), 1e-15 * double(sum) * std::max<double>(1.0, std::log2(n + 1.0)))
        << "n=" << n;
  }
  const float ones[3] = {1.0f, 2.0f, 3.0f};
  EXPECT_EQ(sum_of_squares(ones, 3), 14.0);
}

TEST(KernelsAdamW, Validation) {
  std::vector<double> p(3, 1.0), g(3, 1.0), m(3, 0.0), v(3, 0.0);
  std::vector<AdamWParam<double>> ps = {{p.data(), g.data(), m.data(), v.data(), 3, true}};
  AdamWConfig c;
  EXPECT_THROW(adamw_step(ps, c, 0), Error);
  c.beta2 = 1.0;
  EXPECT_THROW(adamw_step(ps, c, 1), Error);
  c.beta2 = 0.999;
  c.lr = -1;
  EXPECT_THROW(adamw_step(ps, c, 1), Error);
  c.lr = 1e-3;
  ps[0].m = nullptr;
  EXPECT_THROW(adamw_step(ps, c, 1), Error);
  ps[0].m = m.data();
  // No decay: p1 = p0 - lr * g / (|g| + eps) exactly at step 1.
  ps[0].decay = false;
  adamw_step(ps, c, 1);
  EXPECT_NEAR(p[0], 1.0 - 1e-3 / (1.0 + 1e-8), 1e-15);
}

// The kernel's loop (vectorised, threaded) gives the exact bits of its formula written out as a scalar loop
// here, in the same run: m = fma(m, b1, g (1 - b1)); v = fma(v, b2, g^2 (1 - b2)); p = fma(-lr/bc1, m /
// (sqrt(v) / sqrt(bc2) + eps), p (1 - lr wd)), each operation IEEE-rounded in T. Three steps, decay on and
// off, an odd length so vector remainders run, 1 and 2 threads. An elementwise loop must not change a bit
// (docs/numerics.md).
template <typename T>
void scalar_adamw(std::vector<T>& p, const std::vector<T>& g, std::vector<T>& m, std::vector<T>& v,
                  const AdamWConfig& cfg, int64_t step, bool decay) {
  const double bc1 = 1.0 - std::pow(cfg.beta1, double(step)), bc2 = 1.0 - std::pow(cfg.beta2, double(step));
  const T step_size = T(cfg.lr / bc1), bc2_sqrt = T(std::sqrt(bc2)), eps = T(cfg.eps);
  const T b1 = T(cfg.beta1), b2 = T(cfg.beta2), omb1 = T(1.0 - cfg.beta1), omb2 = T(1.0 - cfg.beta2);
  const T keep = T(1.0 - cfg.lr * (decay ? cfg.weight_decay : 0.0));
  for (size_t i = 0; i < p.size(); ++i) {
    m[i] = std::fma(m[i], b1, g[i] * omb1);
    v[i] = std::fma(v[i], b2, (g[i] * g[i]) * omb2);
    p[i] = std::fma(-step_size, m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps), p[i] * keep);
  }
}

TEST(KernelsAdamW, LoopEqualsItsScalarFormulaBitwise) {
  const int64_t n = 100003;
  std::vector<float> p(n);
  const Rng rng{5, 1};
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = rng.normal(uint64_t(i));
  AdamWConfig cfg;
  cfg.lr = 3e-3;
  cfg.weight_decay = 0.1;
  for (const int threads : {1, 2})
    for (const bool decay : {true, false}) {
      set_threads(threads);
      std::vector<float> pp = p, mm(n, 0.0f), vv(n, 0.0f), g(n);
      std::vector<float> rp = p, rm(n, 0.0f), rv(n, 0.0f);
      std::vector<AdamWParam<float>> ps = {{pp.data(), g.data(), mm.data(), vv.data(), n, decay}};
      for (int64_t step = 1; step <= 3; ++step) {
        for (int64_t i = 0; i < n; ++i) g[size_t(i)] = rng.normal(uint64_t(n * step + i)) * 0.01f;
        adamw_step(ps, cfg, step);
        scalar_adamw(rp, g, rm, rv, cfg, step, decay);
      }
      EXPECT_EQ(std::memcmp(pp.data(), rp.data(), n * sizeof(float)), 0)
          << "p, decay " << decay << ", " << threads;
      EXPECT_EQ(std::memcmp(mm.data(), rm.data(), n * sizeof(float)), 0) << "m, decay " << decay;
      EXPECT_EQ(std::memcmp(vv.data(), rv.data(), n * sizeof(float)), 0) << "v, decay " << decay;
      EXPECT_NE(std::memcmp(pp.data(), p.data(), n * sizeof(float)), 0) << "the steps changed p";
    }
  set_threads(1);
}
