// RoPE / YaRN: inv_freq against docs/reference/architecture.md A.4 sample values (7B) and the D.1 tiny ramp,
// the HF computation written out in tests/reference/kernels_rope.py (float32 torch), forward/backward vs
// torch, float64 finite differences, orthogonality, and the rope settings read by model::parse_rope_params.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "kernels/gradcheck.h"
#include "kernels/rope.h"
#include "kernels_util.h"
#include "model/config.h"
#include "model/decoder.h"

using namespace olmosft;
using nlohmann::json;

namespace {
// HF yarn settings of Olmo 3 7B: rope_theta 500000, head_dim 128, 65536 positions (original 8192).
RopeConfig yarn_config(int64_t head_dim, int64_t max_pos, int64_t original) {
  RopeConfig c;
  c.rope_type = "yarn";
  c.theta = 500000.0;
  c.head_dim = head_dim;
  c.max_position_embeddings = max_pos;
  c.factor = 8.0;
  c.original_max_position_embeddings = original;
  c.attention_factor = 1.2079441541679836;
  return c;
}
RopeConfig olmo3_7b_yarn() { return yarn_config(128, 65536, 8192); }
// A fixture's HF config through the model's parser (the one config reader) to the kernel's frequencies.
RopeFreqs fixture_freqs(const json& c) {
  const double theta = c["rope_theta"].get<double>();
  const int64_t max_pos = c["max_position_embeddings"].get<int64_t>();
  model::RopeParams p;
  p.rope_theta = theta;
  if (!c["rope_scaling"].is_null())
    p = model::parse_rope_params(c["rope_scaling"], "fixture", theta, max_pos);
  return model::olmo3_rope_frequencies(p, c["head_dim"].get<int64_t>(), max_pos);
}
// Units in the last place between two floats.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}
}  // namespace

TEST(KernelsRope, Olmo3SevenBSampleValues) {
  RopeFreqs f = rope_frequencies(olmo3_7b_yarn());
  ASSERT_EQ(f.inv_freq.size(), 64u);
  EXPECT_EQ(f.yarn_low, 18);
  EXPECT_EQ(f.yarn_high, 35);
  EXPECT_EQ(f.yarn_factor, 8.0);
  EXPECT_EQ(f.attention_scaling, 1.2079441541679836);
  // docs/reference/architecture.md A.4 (11 significant digits; fp32 has ~7): 2e-7 relative.
  EXPECT_NEAR(f.inv_freq[19] / 1.9282754938e-02, 1.0, 2e-7);
  EXPECT_NEAR(f.inv_freq[26] / 2.8467184387e-03, 1.0, 2e-7);
  EXPECT_NEAR(f.inv_freq[34] / 1.6561303595e-04, 1.0, 2e-7);
  EXPECT_NEAR(f.inv_freq[63] / 3.0689259889e-07, 1.0, 2e-7);
  // Dims 0..18 unchanged, >= 35 divided by 8; base value at 19.
  RopeConfig d = olmo3_7b_yarn();
  d.rope_type = "default";
  RopeFreqs b = rope_frequencies(d);
  EXPECT_EQ(b.attention_scaling, 1.0);
  EXPECT_NEAR(b.inv_freq[19] / 2.0329105981e-02, 1.0, 2e-7);
  for (int i = 0; i <= 18; ++i) EXPECT_EQ(f.inv_freq[size_t(i)], b.inv_freq[size_t(i)]) << i;
  for (int i = 35; i < 64; ++i)
    EXPECT_NEAR(f.inv_freq[size_t(i)] * 8 / b.inv_freq[size_t(i)], 1.0, 3e-7) << i;
  EXPECT_LT(f.inv_freq[19], b.inv_freq[19]);
}

TEST(KernelsRope, TinyConfigRamp) {
  // D.1 tiny: head_dim 16, max 512, original 64 -> factor 8, low/high 0/2, ramp [0, .5, 1, 1, ...].
  RopeConfig c = yarn_config(16, 512, 64);
  RopeFreqs f = rope_frequencies(c);
  EXPECT_EQ(f.yarn_low, 0);
  EXPECT_EQ(f.yarn_high, 2);
  RopeConfig d = c;
  d.rope_type = "default";
  RopeFreqs b = rope_frequencies(d);
  const double ramp[8] = {0, .5, 1, 1, 1, 1, 1, 1};
  for (int i = 0; i < 8; ++i) {
    const double expect = b.inv_freq[size_t(i)] / 8 * ramp[i] + b.inv_freq[size_t(i)] * (1 - ramp[i]);
    EXPECT_NEAR(f.inv_freq[size_t(i)] / expect, 1.0, 3e-7) << i;
  }
  // The factor is recomputed from the context lengths, not read from "factor".
  RopeConfig c2 = c;
  c2.factor = 2.0;
  EXPECT_EQ(rope_frequencies(c2).inv_freq, f.inv_freq);
  c2.original_max_position_embeddings.reset();
  c2.max_position_embeddings = 64;
  EXPECT_NE(rope_frequencies(c2).inv_freq, f.inv_freq);
}

TEST(KernelsRope, FrequenciesAndTablesVsTorch) {
  auto fx = kt::load_fixture("rope.json");
  for (const auto& cs : fx["cases"]) {
    const std::string name = cs["name"];
    RopeFreqs f = fixture_freqs(cs["config"]);
    auto ref = kt::vec<double>(cs["inv_freq"]);
    ASSERT_EQ(f.inv_freq.size(), ref.size()) << name;
    int64_t worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, ulps(f.inv_freq[i], float(ref[i])));
    // Bit-exact: the same fp32 operations in the same order (pow is rounded once from double, which is
    // what torch returned for these exponents; rope.cpp is compiled without FMA contraction).
    EXPECT_EQ(worst, 0) << name << ": inv_freq differs from the HF computation by " << worst << " ulp";
    EXPECT_NEAR(f.attention_scaling, cs["attention_scaling"].get<double>(), 1e-15) << name;
    const int64_t T = cs["T"], D = cs["D"];
    auto pos = kt::vec<int32_t>(cs["positions"]);
    std::vector<float> c(size_t(T * D / 2)), s(size_t(T * D / 2));
    rope_tables<float>(f, pos.data(), T, c.data(), s.data());
    // cos/sin of the same fp32 angle: std::cos in double rounded to float vs torch's float cos (<= 1 ulp)
    // then times the scale (1.21, one more rounding): <= 2 ulp of 1.2 = 2.4e-7.
    double e = std::max(kt::max_abs(c, kt::vec<double>(cs["cos_half"])),
                        kt::max_abs(s, kt::vec<double>(cs["sin_half"])));
    EXPECT_LT(e, 2.5e-7) << name;
    std::printf("[measured] %s: inv_freq max %lld ulp, cos/sin max abs err %.2e\n", name.c_str(),
                (long long)worst, e);
  }
}

template <typename S>
void apply_vs_torch(double tol_fwd, double tol_bwd) {
  auto fx = kt::load_fixture("rope.json");
  for (const auto& cs : fx["cases"]) {
    const std::string name = cs["name"];
    RopeFreqs f = fixture_freqs(cs["config"]);
    const int64_t NT = cs["T"], H = cs["H"], D = cs["D"];
    auto pos = kt::vec<int32_t>(cs["positions"]);
    std::vector<S> c(size_t(NT * D / 2)), s(size_t(NT * D / 2));
    rope_tables<S>(f, pos.data(), NT, c.data(), s.data());
    auto y = kt::vec<S>(cs["x"]);
    rope_forward<S>(y.data(), c.data(), s.data(), NT, H, D, H * D);
    const char* yref = std::is_same_v<S, float> ? "y32" : "y64";
    EXPECT_LT(kt::max_rel(y, kt::vec<double>(cs[yref])), tol_fwd) << name;
    auto dx = kt::vec<S>(cs["dy"]);
    rope_backward<S>(dx.data(), c.data(), s.data(), NT, H, D, H * D);
    EXPECT_LT(kt::max_rel(dx, kt::vec<double>(cs["dx"])), tol_bwd) << name;
    std::printf("[measured] %s %s: fwd rel err %.2e, bwd rel err %.2e\n", name.c_str(),
                std::is_same_v<S, float> ? "float" : "double", kt::max_rel(y, kt::vec<double>(cs[yref])),
                kt::max_rel(dx, kt::vec<double>(cs["dx"])));
  }
}
// float forward vs torch's float32 output: same fp32 ops, cos/sin differ by <= 1 ulp: 1e-6.
// double vs the float64 reference built on the same fp32 angles: cos/sin evaluated at the fp32
// table values (torch) vs recomputed in double here: ~1e-7. Backward likewise.
TEST(KernelsRope, ApplyVsTorchFloat) { apply_vs_torch<float>(1e-6, 1e-6); }
TEST(KernelsRope, ApplyVsTorchDouble) { apply_vs_torch<double>(2e-7, 2e-7); }

TEST(KernelsRope, FiniteDifferencesOrthogonalityAndStride) {
  RopeFreqs f = rope_frequencies(olmo3_7b_yarn());
  const int64_t T = 5, H = 3, D = 128, ld = H * D + 7;  // padded token stride (fused QKV layout)
  const std::vector<int32_t> pos = {0, 1, 4000, 0, 9000};
  std::vector<double> c(size_t(T * D / 2)), s(size_t(T * D / 2));
  rope_tables<double>(f, pos.data(), T, c.data(), s.data());
  auto x = kt::randn<double>(static_cast<size_t>(T * ld), 1),
       r = kt::randn<double>(static_cast<size_t>(T * ld), 2);
  std::vector<double> y;
  auto loss = [&] {
    y = x;
    rope_forward<double>(y.data(), c.data(), s.data(), T, H, D, ld);
    return kt::dot(y, r);
  };
  std::vector<double> dx = r;
  rope_backward<double>(dx.data(), c.data(), s.data(), T, H, D, ld);
  // Linear map: central differences are exact up to rounding (~1e-10).
  EXPECT_LT(fd_max_rel_err(loss, x.data(), int64_t(x.size()), dx.data()), 1e-8);
  // Padding between tokens is untouched by forward and backward.
  loss();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = H * D; j < ld; ++j) EXPECT_EQ(y[size_t(t * ld + j)], x[size_t(t * ld + j)]);
  // R^T R = scale^2 I.
  std::vector<double> z = x;
  rope_forward<double>(z.data(), c.data(), s.data(), T, H, D, ld);
  rope_backward<double>(z.data(), c.data(), s.data(), T, H, D, ld);
  const double s2 = f.attention_scaling * f.attention_scaling;
  double e = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H * D; ++j)
      e = std::max(e, std::abs(z[size_t(t * ld + j)] - s2 * x[size_t(t * ld + j)]));
  EXPECT_LT(e, 1e-13);
  // Position 0 is the identity times the scale.
  for (int64_t j = 0; j < H * D; ++j) EXPECT_NEAR(y[size_t(j)], f.attention_scaling * x[size_t(j)], 1e-15);
}

TEST(KernelsRope, ConfigParsingAndValidation) {
  RopeConfig d;
  d.theta = 500000.0;
  d.head_dim = 128;
  d.max_position_embeddings = 65536;
  EXPECT_EQ(rope_frequencies(d).attention_scaling, 1.0);
  // rope_parameters style carries rope_theta inside.
  const auto parse = [](const char* js, int64_t max_pos = 65536) {
    return model::parse_rope_params(json::parse(js), "config.json rope_scaling", 500000.0, max_pos);
  };
  EXPECT_EQ(parse(R"({"rope_type": "default", "rope_theta": 10000})").rope_theta, 10000.0);
  // Missing attention_factor: 0.1 ln(factor) + 1.
  const model::RopeParams y =
      parse(R"({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192})");
  EXPECT_NEAR(model::olmo3_rope_frequencies(y, 128, 65536).attention_scaling, 0.1 * std::log(8.0) + 1.0,
              1e-15);
  auto bad = [&](const char* js) {
    try {
      parse(js);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("config.json rope_scaling"), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(bad(R"({"rope_type": "llama3", "factor": 8})"));
  EXPECT_TRUE(bad(R"({"rope_type": "yarn"})"));
  EXPECT_TRUE(bad(R"({"rope_type": "yarn", "factor": "8"})"));
  EXPECT_TRUE(bad(R"({"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": -1})"));
  EXPECT_TRUE(bad(R"([1, 2])"));
  RopeConfig odd = d;
  odd.head_dim = 7;
  EXPECT_THROW(rope_frequencies(odd), Error);
  std::vector<int32_t> neg = {0, -1};
  std::vector<float> c(16), s(16);
  EXPECT_THROW(rope_tables<float>(rope_frequencies(d), neg.data(), 2, c.data(), s.data()), Error);
}

TEST(KernelsRope, TensorOverloadOnFusedQkvSlice) {
  // A fused QKV buffer [T, Hq + 2 Hkv, D]; rotate the q and k head slices in place via the Tensor
  // overload and compare with the raw-pointer calls on a copy (v must stay untouched).
  RopeFreqs f = rope_frequencies(olmo3_7b_yarn());
  const int64_t T = 4, Hq = 2, Hkv = 1, D = 128, H3 = Hq + 2 * Hkv;
  const std::vector<int32_t> pos = {0, 1, 2, 0};
  RopeTable<float> tab;
  tab.build(f, pos.data(), T);
  Tensor qkv = Tensor::from(kt::randn<float>(static_cast<size_t>(T * H3 * D), 3), {T, H3, D});
  std::vector<float> ref(qkv.data<float>(), qkv.data<float>() + T * H3 * D);
  Tensor q = qkv.slice(1, 0, Hq), k = qkv.slice(1, Hq, Hq + Hkv);
  rope_forward(q, tab);
  rope_forward(k, tab);
  rope_forward<float>(ref.data(), tab.cos.data(), tab.sin.data(), T, Hq + Hkv, D, H3 * D);
  std::vector<float> got(qkv.data<float>(), qkv.data<float>() + T * H3 * D);
  EXPECT_EQ(kt::max_abs(got, ref), 0.0);
  rope_backward(q, tab);
  rope_backward<float>(ref.data(), tab.cos.data(), tab.sin.data(), T, Hq, D, H3 * D);
  got.assign(qkv.data<float>(), qkv.data<float>() + T * H3 * D);
  EXPECT_EQ(kt::max_abs(got, ref), 0.0);
  Tensor wrong = Tensor::zeros({T, Hq, 64});
  EXPECT_THROW(rope_forward(wrong, tab), Error);  // head_dim mismatch
  Tensor wrong_t = Tensor::zeros({T + 1, Hq, D});
  EXPECT_THROW(rope_forward(wrong_t, tab), Error);  // token count mismatch
  Tensor td = Tensor::zeros({T, Hq, D}, DType::F64);
  EXPECT_THROW(rope_forward(td, tab), Error);  // dtype mismatch
}
