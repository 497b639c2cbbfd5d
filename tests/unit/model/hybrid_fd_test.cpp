// float64 finite-difference checks of the whole hybrid model (decoder_run<double>) on the fixture batch
// and weights (routing margins >= 1.48e-3, so the +-1e-6 perturbations never change the expert choice).
// Loss = CE + 0.1 * LM z + sum_l (1 * LB_l + 0.1 * Z_l), so every term is visible in the gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "hybrid_test_util.h"
#include "kernels/gradcheck.h"

using namespace hybrid_test;

namespace {

struct Fd {
  DoubleModel m = load_model_f64();
  FixtureBatch fb = load_batch();
  DecoderOptions opts;
  LossConfig loss;
  double n = 0;
  bool row_positions = false;

  Fd() {
    opts.kda_chunk = 16;
    loss.weight[olmosft::model::kLossLmZ] = 0.1;
    loss.weight[olmosft::model::kLossMoeLb] = 1.0;
    loss.weight[olmosft::model::kLossRouterZ] = 0.1;
    for (auto t : fb.trained) n += t;
  }
  double total(const LossParts& lp) const {
    return (lp.sum[olmosft::model::kLossCe] +
            loss.weight[olmosft::model::kLossLmZ] * lp.sum[olmosft::model::kLossLmZ]) /
               n +
           lp.sum[olmosft::model::kLossMoeLb] + lp.sum[olmosft::model::kLossRouterZ];
  }
  double eval() {
    const Batch b = fb.batch();
    return total(
        decoder_run<double>(m.config, opts, m.wp(), nullptr, b, loss, 1.0 / n, 1.0, nullptr, nullptr));
  }
  void grads() {
    for (auto& g : m.g) std::fill(g.begin(), g.end(), 0.0);
    auto gp = m.gp();
    const Batch b = fb.batch();
    decoder_run<double>(m.config, opts, m.wp(), &gp, b, loss, 1.0 / n, 1.0, nullptr, nullptr);
  }
  // FD over `count` entries of a tensor starting at `offset`.
  double check(const std::string& name, int64_t offset, int64_t count) {
    const int i = m.index(name);
    auto& w = m.w[static_cast<size_t>(i)];
    count = std::min<int64_t>(count, static_cast<int64_t>(w.size()) - offset);
    return fd_max_rel_err([&] { return eval(); }, w.data() + offset, count,
                          m.g[static_cast<size_t>(i)].data() + offset, 1e-6);
  }
};

}  // namespace

TEST(HybridFd, SelectedParametersMatchFiniteDifferences) {
  Fd fd;
  fd.grads();
  struct Slice {
    std::string name;
    int64_t offset, count;
  };
  const std::vector<Slice> slices = {
      {"model.layers.2.self_attn.A_log", 0, 2},
      {"model.layers.0.self_attn.A_log", 0, 2},
      {"model.layers.0.self_attn.dt_bias", 0, 6},
      {"model.layers.5.self_attn.dt_bias", 17, 6},
      {"model.layers.3.self_attn.g_proj_2.bias", 0, 6},
      {"model.layers.3.self_attn.o_norm.weight", 0, 4},
      {"model.layers.1.self_attn.beta_proj.weight", 0, 4},
      {"model.layers.1.self_attn.q_conv1d.weight", 0, 4},
      {"model.layers.1.self_attn.v_conv1d.weight", 8, 4},
      {"model.layers.4.self_attn.f_proj_1.weight", 0, 4},
      {"model.layers.1.mlp.router.gate.weight", 0, 6},
      {"model.layers.6.mlp.router.gate.weight", 300, 6},
      {"model.layers.2.mlp.latent_down_proj.weight", 0, 4},
      {"model.layers.2.mlp.experts.3.gate_proj.weight", 0, 4},
      {"model.layers.2.mlp.shared_expert.up_proj.weight", 0, 4},
      {"model.layers.7.self_attn.ssmax_scale", 0, 2},
      {"model.layers.7.self_attn.q_norm.weight", 0, 4},
      {"model.layers.7.self_attn.k_norm.weight", 30, 2},
      {"model.layers.7.self_attn.g_proj.weight", 0, 4},
      {"model.layers.0.mlp.gate_proj.weight", 0, 4},
      {"model.embed_norm.weight", 0, 4},
      {"model.layers.4.pre_attention_layernorm.weight", 0, 4},
  };
  for (const auto& s : slices) {
    const double err = fd.check(s.name, s.offset, s.count);
    std::printf("FD %-48s max rel err %.2e\n", s.name.c_str(), err);
    EXPECT_LT(err, 1e-5) << s.name;
  }
}

TEST(HybridFd, SsmaxScaleWithRowPositions) {
  Fd fd;
  fd.opts.ssmax_row_positions = true;
  fd.grads();
  EXPECT_LT(fd.check("model.layers.7.self_attn.ssmax_scale", 0, 2), 1e-5);
  EXPECT_LT(fd.check("model.layers.7.self_attn.q_norm.weight", 0, 3), 1e-5);
}

// The double model reproduces the fixture's f64 truth far more tightly than the f32 model can.
TEST(HybridFd, DoubleModelMatchesFixtureTruth) {
  Fd fd;
  fd.loss.weight[olmosft::model::kLossLmZ] = 1e-5;
  fd.loss.weight[olmosft::model::kLossMoeLb] = 0.01;
  fd.loss.weight[olmosft::model::kLossRouterZ] = 1e-5;
  fd.grads();
  auto grads = safetensors::Reader::open(fixture_dir() + "/grads.safetensors");
  double worst = 0;
  for (size_t i = 0; i < fd.m.names.size(); ++i) {
    Tensor ref = grads->copy(fd.m.names[i]);
    const float* r = ref.data<float>();
    double md = 0, mr = 0;
    for (int64_t j = 0; j < ref.numel(); ++j) {
      md = std::max(md, std::fabs(fd.m.g[i][static_cast<size_t>(j)] - r[j]));
      mr = std::max(mr, std::fabs(static_cast<double>(r[j])));
    }
    worst = std::max(worst, md / std::max(mr, 1e-30));
  }
  std::printf("double model vs fixture grads: worst max|d|/max|ref| %.3g\n", worst);
  // The reference is float64 stored as float32: ~6e-8 relative rounding.
  EXPECT_LT(worst, 1e-5);
}

// Packed == per-document in float64: each document run alone as a batch of one equals its packed slice.
TEST(HybridFd, PackedEqualsPerDocumentFloat64) {
  Fd fd;
  const Batch b = fd.fb.batch();
  const int64_t V = fd.m.config.vocab_size;
  std::vector<float> packed(static_cast<size_t>(b.B * b.T * V));
  decoder_run<double>(fd.m.config, fd.opts, fd.m.wp(), nullptr, b, fd.loss, 1.0, 1.0, packed.data(), nullptr);
  // Documents from segment ids.
  double worst = 0;
  int docs = 0;
  for (int64_t r = 0; r < b.B; ++r) {
    int64_t s = 0;
    while (s < b.T) {
      int64_t e = s;
      while (e < b.T && fd.fb.segments[static_cast<size_t>(r * b.T + e)] ==
                            fd.fb.segments[static_cast<size_t>(r * b.T + s)])
        ++e;
      FixtureBatch one;
      one.B = 1;
      one.T = e - s;
      for (int64_t t = s; t < e; ++t) {
        const size_t i = static_cast<size_t>(r * b.T + t);
        one.tokens.push_back(fd.fb.tokens[i]);
        one.segments.push_back(0);
        one.positions.push_back(static_cast<int32_t>(t - s));
        one.targets.push_back(fd.fb.targets[i]);
        one.trained.push_back(fd.fb.trained[i]);
      }
      std::vector<float> lg(static_cast<size_t>(one.T * V));
      const Batch ob = one.batch();
      decoder_run<double>(fd.m.config, fd.opts, fd.m.wp(), nullptr, ob, fd.loss, 1.0, 1.0, lg.data(),
                          nullptr);
      for (int64_t i = 0; i < one.T * V; ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(lg[static_cast<size_t>(i)]) -
                                          packed[static_cast<size_t>((r * b.T + s) * V + i)]));
      ++docs;
      s = e;
    }
  }
  EXPECT_EQ(docs, 5);
  std::printf("float64 packed vs per-document: max|d| %.3g (logits stored as float)\n", worst);
  EXPECT_LT(worst, 2e-6);  // float rounding of logits up to ~8 in magnitude: 4.8e-7 per value
}
