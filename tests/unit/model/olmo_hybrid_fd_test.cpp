// Olmo Hybrid (olmo_hybrid) in float64: gradients against finite differences, packed rows against each
// document run alone (the GDN state and the short conv reset at document boundaries), the chunked delta
// rule against the recurrent one. Loss = (CE + 0.1 LM z) / trained, so every term is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/gradcheck.h"
#include "olmo_hybrid_test_util.h"

using namespace olmo_hybrid_test;

namespace {

struct Fd {
  DoubleModel m;
  PackedBatch pb;
  DecoderOptions opts;
  LossConfig loss;
  double n = 0;

  explicit Fd(const ModelConfig& c) : m(random_model(c, 41)), pb({{40}, {17, 23}}, c.vocab_size) {
    opts.kda_chunk = 16;  // documents of 17-40 tokens cross chunk boundaries
    loss.weight[kLossLmZ] = 0.1;
    n = pb.trained_count();
  }
  LossParts run(std::vector<double*>* g, float* logits = nullptr) {
    const Batch b = pb.batch();
    return decoder_run<double>(m.config, opts, m.wp(), g, b, loss, 1.0 / n, 1.0, logits, nullptr);
  }
  double eval() {
    const LossParts lp = run(nullptr);
    return (lp.sum[kLossCe] + loss.weight[kLossLmZ] * lp.sum[kLossLmZ]) / n;
  }
  void grads() {
    m.zero_grads();
    auto gp = m.gp();
    run(&gp);
  }
  double check(const std::string& name, int64_t offset, int64_t count) {
    const size_t i = static_cast<size_t>(m.index(name));
    count = std::min<int64_t>(count, static_cast<int64_t>(m.w[i].size()) - offset);
    return fd_max_rel_err([&] { return eval(); }, m.w[i].data() + offset, count, m.g[i].data() + offset,
                          1e-5);
  }
};

void check_slices(Fd& fd) {
  fd.grads();
  const std::string g0 = "model.layers.0.linear_attn.", g2 = "model.layers.2.linear_attn.";
  const std::vector<std::tuple<std::string, int64_t, int64_t>> slices = {
      {g0 + "A_log", 0, 2},
      {g2 + "dt_bias", 0, 2},
      {g0 + "a_proj.weight", 0, 6},
      {g2 + "b_proj.weight", 60, 6},
      {g0 + "q_proj.weight", 0, 4},
      {g2 + "k_proj.weight", 100, 4},
      {g0 + "v_proj.weight", 0, 4},
      {g0 + "g_proj.weight", 0, 4},
      {g2 + "o_proj.weight", 0, 4},
      {g0 + "o_norm.weight", 0, 4},
      {g0 + "conv1d.weight", 0, 4},                 // q rows
      {g2 + "conv1d.weight", 32 * 4 + 8, 4},        // k rows
      {g0 + "conv1d.weight", 2 * 32 * 4 + 100, 4},  // v rows
      {"model.layers.1.input_layernorm.weight", 0, 4},
      {"model.layers.1.post_attention_layernorm.weight", 0, 4},  // a GDN layer's pre-FFN norm
      {"model.layers.1.mlp.down_proj.weight", 0, 4},
      {"model.layers.3.self_attn.q_norm.weight", 0, 4},
      {"model.layers.3.self_attn.k_proj.weight", 0, 4},
      {"model.layers.3.post_attention_layernorm.weight", 0, 4},  // the attention layer's post-norm
      {"model.layers.3.post_feedforward_layernorm.weight", 0, 4},
      {"model.embed_tokens.weight", 64 * 5, 4},
      {"model.norm.weight", 0, 4},
  };
  for (const auto& [name, off, count] : slices) {
    const double err = fd.check(name, off, count);
    std::printf("FD %-52s max rel err %.2e\n", name.c_str(), err);
    EXPECT_LT(err, 1e-5) << name;
  }
}

}  // namespace

TEST(OlmoHybridFd, GradientsMatchFiniteDifferences) {
  Fd fd(tiny_config(4));
  check_slices(fd);
}

TEST(OlmoHybridFd, NopeAndPositiveEigenvaluesMatchFiniteDifferences) {
  Fd fd(tiny_config(4, /*nope=*/true, /*neg_eigval=*/false));
  check_slices(fd);
}

// Recurrent and chunked delta rules agree in float64 (same model, same batch).
TEST(OlmoHybridFd, ChunkedEqualsRecurrentFloat64) {
  Fd fd(tiny_config(4));
  const int64_t V = fd.m.config.vocab_size, NV = fd.pb.B * fd.pb.T * V;
  std::vector<float> chunked(static_cast<size_t>(NV)), recurrent(static_cast<size_t>(NV));
  fd.run(nullptr, chunked.data());
  fd.opts.kda_recurrent = true;
  fd.run(nullptr, recurrent.data());
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < NV; ++i) {
    worst = std::max(worst, std::fabs(double(chunked[size_t(i)]) - double(recurrent[size_t(i)])));
    scale = std::max(scale, std::fabs(double(chunked[size_t(i)])));
  }
  EXPECT_GT(scale, 0.1);  // the logits were written
  std::printf("float64 chunked vs recurrent logits: max|d| %.3g (stored as float)\n", worst);
  EXPECT_LT(worst, 2e-6);
}

// Packed == per-document in float64: the recurrence and the short conv restart at each document.
TEST(OlmoHybridFd, PackedEqualsPerDocumentFloat64) {
  Fd fd(tiny_config(4));
  const int64_t V = fd.m.config.vocab_size, B = fd.pb.B, T = fd.pb.T;
  std::vector<float> packed(static_cast<size_t>(B * T * V));
  fd.run(nullptr, packed.data());
  double worst = 0;
  int docs = 0;
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t s = 0; s < T;) {
      int64_t e = s;
      const auto seg = [&](int64_t t) { return fd.pb.segments[static_cast<size_t>(r * T + t)]; };
      while (e < T && seg(e) == seg(s)) ++e;
      Fd one(fd.m.config);
      one.m = fd.m;
      one.pb.B = 1;
      one.pb.T = e - s;
      auto slice = [&](const auto& v) {
        return std::decay_t<decltype(v)>(v.begin() + r * T + s, v.begin() + r * T + e);
      };
      one.pb.tokens = slice(fd.pb.tokens);
      one.pb.segments.assign(static_cast<size_t>(e - s), 1);
      one.pb.positions = slice(fd.pb.positions);
      one.pb.targets = slice(fd.pb.targets);
      one.pb.trained = slice(fd.pb.trained);
      std::vector<float> lg(static_cast<size_t>((e - s) * V));
      one.run(nullptr, lg.data());
      for (int64_t i = 0; i < (e - s) * V; ++i)
        worst =
            std::max(worst, std::fabs(double(lg[size_t(i)]) - double(packed[size_t((r * T + s) * V + i)])));
      ++docs;
      s = e;
    }
  }
  EXPECT_EQ(docs, 3);
  EXPECT_GT(*std::max_element(packed.begin(), packed.end()), 0.1f);  // the logits were written
  std::printf("float64 packed vs per-document logits: max|d| %.3g (stored as float)\n", worst);
  EXPECT_LT(worst, 2e-6);
}

// The GDN decay is initialised as HF does: A = exp(A_log) in [0, 16], softplus(dt_bias) = dt in [1e-3, 0.1].
TEST(OlmoHybridInit, DecayFollowsTransformersInit) {
  const ModelConfig c = tiny_config(4);
  std::vector<Param> params = allocate_params(c);
  init_params(params, c, 7);
  int checked = 0;
  for (const Param& p : params) {
    const float* v = p.value.data<float>();
    if (p.name.ends_with("linear_attn.A_log")) {
      for (int64_t j = 0; j < p.value.numel(); ++j) {
        EXPECT_GT(std::exp(v[j]), 0.0);
        EXPECT_LE(std::exp(v[j]), 16.0 + 1e-4);
      }
      ++checked;
    } else if (p.name.ends_with("linear_attn.dt_bias")) {
      for (int64_t j = 0; j < p.value.numel(); ++j) {
        const double dt = std::log1p(std::exp(double(v[j])));  // softplus
        EXPECT_GE(dt, 1e-3 * (1 - 1e-5));
        EXPECT_LE(dt, 0.1 * (1 + 1e-5));
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);  // 3 GDN layers x (A_log, dt_bias)
}
