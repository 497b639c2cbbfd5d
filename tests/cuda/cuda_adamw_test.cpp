// Multi-tensor clip + AdamW (src/cuda/adamw.h) against a host reference: the global norm in float64, and the
// update as the CPU kernel's fp32 sequence (kernels/adamw.cpp, same constants, same order of operations).
// Tolerances: norm: the device sums the same squares in double in another order: 1e-12 relative. Clip and
// update: the device uses correctly rounded fp32 operations without contraction; the host reference may be
// contracted into FMAs by the compiler, so each result may differ by the rounding of each operation:
// m, v: 2^-22 (|b m| + |(1-b) g|); p: 2^-21 (|p keep| + |step|), step = lr/bc1 * m/denom.
#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

#include "cuda/adamw.h"
#include "cuda/check.h"
#include "cuda_test_util.h"
#include "kernels/adamw_config.h"

using namespace olmosft::cuda;
using namespace olmosft::cuda::test;

// One definition: the CUDA name is the CPU optimizer's type (same fields, same defaults).
static_assert(std::is_same_v<olmosft::cuda::AdamWConfig, olmosft::AdamWConfig>);

namespace {

const int64_t kSizes[] = {150000, 1000, 3, 0};  // 3 chunks, 1, 1, none
const bool kDecay[] = {true, false, true, true};

struct State {
  std::vector<std::vector<float>> p, g, m, v;
};

State make_state() {
  State s;
  uint32_t seed = 31;
  for (int64_t n : kSizes) {
    s.p.push_back(random_f32(size_t(n), 1.0f, seed++));
    s.g.push_back(random_f32(size_t(n), 0.01f, seed++));
    s.m.push_back(random_f32(size_t(n), 0.001f, seed++));
    auto v = random_f32(size_t(n), 1e-5f, seed++);
    for (auto& x : v) x = x * x;
    s.v.push_back(v);
  }
  return s;
}

struct DevState {
  std::vector<DeviceArray<float>> p, g, m, v;
  std::vector<DeviceArray<uint16_t>> pb;
  std::vector<AdamWTensor> tensors;
  explicit DevState(const State& s) {
    for (size_t k = 0; k < s.p.size(); ++k) {
      p.emplace_back(s.p[k]), g.emplace_back(s.g[k]), m.emplace_back(s.m[k]), v.emplace_back(s.v[k]);
      pb.emplace_back(s.p[k].size());
    }
    for (size_t k = 0; k < s.p.size(); ++k)
      tensors.push_back(
          {p[k].data(), g[k].data(), m[k].data(), v[k].data(), pb[k].data(), kSizes[k], kDecay[k]});
  }
};

struct Out {
  double norm;
  State s;
  std::vector<std::vector<uint16_t>> pb;
};

Out run(const State& s0, double max_norm, const AdamWConfig& cfg, int64_t step) {
  DevState d(s0);
  MultiTensorAdamW opt(d.tensors);
  Out o;
  o.norm = opt.clip_grad_norm(max_norm);
  opt.step(cfg, step);
  check(cudaDeviceSynchronize(), "adamw test");
  for (size_t k = 0; k < s0.p.size(); ++k) {
    o.s.p.push_back(d.p[k].download()), o.s.g.push_back(d.g[k].download());
    o.s.m.push_back(d.m[k].download()), o.s.v.push_back(d.v[k].download());
    o.pb.push_back(d.pb[k].download());
  }
  return o;
}

}  // namespace

TEST(CudaAdamW, ClipAndStepMatchCpuSequence) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  const State s0 = make_state();
  AdamWConfig cfg;
  cfg.lr = 3e-4, cfg.weight_decay = 0.1, cfg.eps = 1e-8;
  const int64_t step = 7;
  double ss = 0;
  for (const auto& g : s0.g)
    for (float x : g) ss += double(x) * double(x);
  const double norm = std::sqrt(ss), max_norm = 0.5 * norm;  // clipping active: coef ~ 0.5
  const Out o = run(s0, max_norm, cfg, step);
  EXPECT_NEAR(o.norm, norm, 1e-12 * norm);
  // Host reference: kernels/adamw.cpp's fp32 sequence.
  const float c = float(std::min(1.0, max_norm / (norm + 1e-6)));
  const double bc1 = 1.0 - std::pow(cfg.beta1, double(step)), bc2 = 1.0 - std::pow(cfg.beta2, double(step));
  const float step_size = float(cfg.lr / bc1), bc2_sqrt = float(std::sqrt(bc2)), eps = float(cfg.eps);
  const float b1 = float(cfg.beta1), b2 = float(cfg.beta2), omb1 = float(1.0 - cfg.beta1),
              omb2 = float(1.0 - cfg.beta2);
  for (size_t k = 0; k < s0.p.size(); ++k) {
    SCOPED_TRACE("tensor " + std::to_string(k));
    const float keep = float(1.0 - cfg.lr * (kDecay[k] ? cfg.weight_decay : 0.0));
    std::vector<double> gp, wp, tp, gm, wm, tm, gv, wv, tv, gg, wg, tg;
    for (size_t i = 0; i < s0.p[k].size(); ++i) {
      const float gi = s0.g[k][i] * c;
      const float pk = s0.p[k][i] * keep;
      const float mi = s0.m[k][i] * b1 + gi * omb1;
      const float vi = s0.v[k][i] * b2 + (gi * gi) * omb2;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      const float upd = (-step_size) * (mi / denom);
      const float pi = pk + upd;
      gg.push_back(o.s.g[k][i]), wg.push_back(gi), tg.push_back(0x1p-23 * std::fabs(gi));
      gm.push_back(o.s.m[k][i]), wm.push_back(mi),
          tm.push_back(0x1p-22 * (std::fabs(s0.m[k][i] * b1) + std::fabs(gi * omb1)));
      gv.push_back(o.s.v[k][i]), wv.push_back(vi),
          tv.push_back(0x1p-22 * (std::fabs(s0.v[k][i] * b2) + gi * gi * omb2));
      gp.push_back(o.s.p[k][i]), wp.push_back(pi), tp.push_back(0x1p-21 * (std::fabs(pk) + std::fabs(upd)));
      ASSERT_EQ(o.pb[k][i], olmosft::f32_to_bf16(o.s.p[k][i])) << "bf16 copy of p at " << i;
    }
    EXPECT_EQ(count_bad("g (clipped)", gg, wg, tg), 0);
    EXPECT_EQ(count_bad("m", gm, wm, tm), 0);
    EXPECT_EQ(count_bad("v", gv, wv, tv), 0);
    EXPECT_EQ(count_bad("p", gp, wp, tp), 0);
  }
}

// max_norm <= 0: norm only, gradients untouched; max_norm above the norm: coef 1, gradients untouched.
TEST(CudaAdamW, NoClipLeavesGradientsBitForBit) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  const State s0 = make_state();
  for (const double max_norm : {0.0, 1e9}) {
    DevState d(s0);
    MultiTensorAdamW opt(d.tensors);
    opt.clip_grad_norm(max_norm);
    for (size_t k = 0; k < s0.g.size(); ++k) EXPECT_TRUE(bitwise_equal(d.g[k].download(), s0.g[k]));
  }
}

TEST(CudaAdamW, NonFiniteNormThrows) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  State s0 = make_state();
  s0.g[1][17] = INFINITY;
  DevState d(s0);
  MultiTensorAdamW opt(d.tensors);
  EXPECT_THROW(opt.clip_grad_norm(1.0), std::runtime_error);
  EXPECT_TRUE(bitwise_equal(d.g[0].download(), s0.g[0]))
      << "gradients changed although the norm is not finite";
}

TEST(CudaAdamW, Deterministic) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  const State s0 = make_state();
  AdamWConfig cfg;
  const Out a = run(s0, 0.1, cfg, 3), b = run(s0, 0.1, cfg, 3);
  EXPECT_EQ(a.norm, b.norm);
  for (size_t k = 0; k < s0.p.size(); ++k)
    EXPECT_TRUE(bitwise_equal(a.s.p[k], b.s.p[k]) && bitwise_equal(a.s.m[k], b.s.m[k]) &&
                bitwise_equal(a.s.v[k], b.s.v[k]) && bitwise_equal(a.pb[k], b.pb[k]));
}

// Host-side validation: a tensor without a gradient is named by index before anything is uploaded.
TEST(CudaAdamW, RejectsTensorWithoutGradient) {
  std::vector<AdamWTensor> ts(2);
  float dummy = 0;
  ts[0] = {&dummy, &dummy, &dummy, &dummy, nullptr, 1, true};
  ts[1] = {&dummy, nullptr, &dummy, &dummy, nullptr, 1, true};
  try {
    MultiTensorAdamW opt(ts);
    FAIL() << "accepted a tensor without a gradient";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 1"), std::string::npos) << e.what();
  }
}
