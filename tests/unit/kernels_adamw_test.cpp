// Global-norm clipping + AdamW against torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW (five steps,
// weight decay on one tensor and off on the other; the first two steps clip), plus validation.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
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

// The exact bits of three AdamW steps (decay on and off, an odd length so vector remainders run), hashed
// (FNV-1a 64 over p, m, v) and compared with hashes recorded from the scalar loop before the loop was
// vectorised (`#pragma omp simd`, issue #19): an elementwise loop must not change a bit.
TEST(KernelsAdamW, StepsKeepTheScalarLoopsBits) {
  const int64_t n = 100003;
  std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f);
  const Rng rng{5, 1};
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = rng.normal(uint64_t(i));
  AdamWConfig cfg;
  cfg.lr = 3e-3;
  cfg.weight_decay = 0.1;
  std::vector<std::string> got;
  for (const bool decay : {true, false}) {
    std::vector<float> pp = p, mm = m, vv = v;
    std::vector<AdamWParam<float>> ps = {{pp.data(), g.data(), mm.data(), vv.data(), n, decay}};
    for (int64_t step = 1; step <= 3; ++step) {
      for (int64_t i = 0; i < n; ++i) g[size_t(i)] = rng.normal(uint64_t(n * step + i)) * 0.01f;
      adamw_step(ps, cfg, step);
    }
    uint64_t h = 1469598103934665603ull;
    for (const auto* vec : {&pp, &mm, &vv}) {
      const auto* c = reinterpret_cast<const unsigned char*>(vec->data());
      for (size_t i = 0; i < vec->size() * sizeof(float); ++i) h = (h ^ c[i]) * 1099511628211ull;
    }
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    got.push_back(buf);
  }
  if (std::getenv("OLMOSFT_PRINT_ADAMW_HASHES")) std::printf("%s %s\n", got[0].c_str(), got[1].c_str());
  EXPECT_EQ(got[0], "af494f89a880a2a8") << "decay on";
  EXPECT_EQ(got[1], "24081bac84fac9af") << "decay off";
}
