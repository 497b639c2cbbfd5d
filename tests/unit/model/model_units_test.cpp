// The layer units' per-token declarations (saved_floats_per_token) against what the decoder really keeps,
// for both families.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/threads.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/unit_block.h"
#include "train/batch.h"

using namespace olmosft;
using namespace olmosft::model;

namespace {

struct Row {
  std::vector<int32_t> tokens, segments, positions, targets;
  std::vector<uint8_t> trained;
  Row(int64_t T, int64_t V) {
    for (int64_t t = 0; t < T; ++t) {
      tokens.push_back(static_cast<int32_t>(2 + (t * 37) % (V - 2)));
      segments.push_back(t < T / 2 ? 0 : 1);
      positions.push_back(static_cast<int32_t>(t < T / 2 ? t : t - T / 2));
    }
    for (int64_t t = 0; t < T; ++t) {
      const bool next = t + 1 < T && segments[size_t(t + 1)] == segments[size_t(t)];
      targets.push_back(next ? tokens[size_t(t + 1)] : -100);
      trained.push_back(next ? 1 : 0);
    }
  }
  Batch batch() const {
    return olmosft::train::batch_view(1, static_cast<int64_t>(tokens.size()), tokens, segments, positions,
                                      targets, trained);
  }
};

}  // namespace

// Both families: the planned Saved part of the block is the residual streams plus the blocks' declarations
// (less the MoE caches, which moe.cpp sizes), the measured saved bytes add the MoE caches, and the rest of
// the block is the decoder's declared scratch.
static void expect_declarations_match(const std::string& name) {
  set_threads(1);
  const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/" + name + "/config.json");
  auto m = make_model(c, 3);
  const int64_t T = 64;
  const Row r(T, c.vocab_size);
  LossConfig lc;
  m->forward_backward(r.batch(), lc, 1.0 / double(T), 1.0);
  const DecoderRunInfo info = dynamic_cast<Decoder&>(*m).last_run();
  const size_t saved = info.saved_bytes;
  int64_t declared = (c.num_hidden_layers + 1) * c.hidden_size, moe_declared = 0;  // the residual streams
  for (const LayerSpec& s : layer_specs(c)) {
    declared += unit::Block::saved_floats_per_token(c, s);
    if (s.ffn == FfnKind::Moe) moe_declared += unit::MoeUnit::saved_floats_per_token(c);
  }
  std::printf(
      "[units] %s: saved %.1f bytes/token, declared %lld floats/token (%lld bytes); scratch %.1f "
      "bytes/token, planned block %zu bytes\n",
      name.c_str(), double(saved) / double(T), static_cast<long long>(declared),
      static_cast<long long>(4 * declared), double(info.scratch_bytes) / double(T), info.workspace_bytes);
  EXPECT_EQ(info.tokens, T);
  // The declaration counts every saved value as a float; the MoE cache keeps its `kept` flags as bytes
  // and its per-expert loads per layer (not per token).
  EXPECT_GE(4.0 * double(declared) * double(T), 0.99 * double(saved));
  EXPECT_LE(4.0 * double(declared) * double(T), 1.01 * double(saved));
  // The planned part of the saved activations is exactly the declaration less the MoE's (T = 64: every
  // buffer is a multiple of 64 bytes, no rounding).
  EXPECT_EQ(info.workspace_bytes - info.scratch_bytes, size_t(4 * (declared - moe_declared) * T));
  // The rest of the block is the declared scratch: 4 bytes per declared float less 3 for each of the two
  // byte fields (valid flags, LM-head mask), plus the per-layer-size stand-ins (a few KiB at most).
  const int64_t scratch_declared = Decoder::scratch_floats_per_token(c);
  std::printf(
      "[units] %s: scratch declared %lld floats/token, planned %zu bytes (slack %lld)\n", name.c_str(),
      static_cast<long long>(scratch_declared), info.scratch_bytes,
      static_cast<long long>(info.scratch_bytes) - static_cast<long long>((4 * scratch_declared - 6) * T));
  EXPECT_GE(info.scratch_bytes, size_t((4 * scratch_declared - 6) * T));
  EXPECT_LE(info.scratch_bytes, size_t((4 * scratch_declared - 6) * T + 16384));
}

TEST(ModelUnits, HybridSavedBytesMatchTheBlocksDeclarations) { expect_declarations_match("olmo3moe_tiny"); }

TEST(ModelUnits, Olmo3SavedBytesMatchTheBlocksDeclarations) { expect_declarations_match("olmo3_tiny"); }

TEST(ModelUnits, HybridWorkspaceIsPlannedOnceAndReusedWhileTokensDoNotGrow) {
  set_threads(1);
  const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3moe_tiny/config.json");
  auto m = make_model(c, 3);
  auto& hm = dynamic_cast<Decoder&>(*m);
  LossConfig lc;
  const Row big(64, c.vocab_size), small(32, c.vocab_size), bigger(96, c.vocab_size);
  const LossParts first = m->forward_backward(big.batch(), lc, 1.0 / 64.0, 1.0);
  const size_t block = hm.last_run().workspace_bytes;
  ASSERT_GT(block, 0u);
  m->forward_backward(small.batch(), lc, 1.0 / 32.0, 1.0);
  EXPECT_EQ(hm.last_run().workspace_bytes, block);  // fewer tokens: the same block
  EXPECT_EQ(hm.last_run().tokens, 32);
  // A reused (larger, dirty) block gives the same numbers as a fresh one.
  const LossParts again = m->forward_backward(big.batch(), lc, 1.0 / 64.0, 1.0);
  EXPECT_EQ(again.sum[model::kLossCe], first.sum[model::kLossCe]);
  EXPECT_EQ(again.sum[model::kLossMoeLb], first.sum[model::kLossMoeLb]);
  m->forward_backward(bigger.batch(), lc, 1.0 / 96.0, 1.0);
  EXPECT_GT(hm.last_run().workspace_bytes, block);  // more tokens: planned again
}

// activation_bytes (what `olmosft plan` reads) is the block each model really plans, under each remat
// policy, and recomputation keeps less: full less than attn less than none.
TEST(ModelUnits, ActivationBytesIsWhatTheModelsAllocateUnderEachRematPolicy) {
  set_threads(1);
  const int64_t T = 64;
  for (const char* fam : {"olmo3_tiny", "olmo3moe_tiny"}) {
    const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/" + fam + "/config.json");
    const Row r(T, c.vocab_size);
    size_t saved[3] = {0, 0, 0};
    int i = 0;
    for (const Remat remat : {Remat::None, Remat::Attn, Remat::Full}) {
      const MemoryPolicy policy{remat, SavedDtype::F32};
      auto m = make_model(c, 3);
      ASSERT_TRUE(m->set_memory_policy(policy));
      m->forward_backward(r.batch(), LossConfig{}, 1.0 / double(T), 1.0);
      const ActivationBytes a = activation_bytes(c, 1, T, policy);
      const size_t planned = dynamic_cast<Decoder&>(*m).workspace_bytes();
      std::printf("[units] %s remat %s: saved %zu, working %zu, kernels %zu bytes (T = %lld)\n", fam,
                  remat_name(remat), a.saved, a.working, a.kernels, static_cast<long long>(T));
      EXPECT_EQ(planned, a.total()) << fam << " remat " << remat_name(remat);
      saved[i++] = a.saved;
    }
    EXPECT_LT(saved[1], saved[0]) << fam << ": attn keeps less than none";
    EXPECT_LT(saved[2], saved[1]) << fam << ": full keeps less than attn";
    // full keeps the block inputs: the L + 1 residual streams of d floats per token
    EXPECT_EQ(saved[2], size_t(4 * (c.num_hidden_layers + 1) * c.hidden_size * T)) << fam;
  }
}

namespace {
// Relative L2 distance between two models' gradients: over all parameters together (returned) and the
// largest per tensor (worst, which).
double grad_rel_diff(CausalLM& a, CausalLM& b, double* worst, std::string* which) {
  double num_all = 0, den_all = 0;
  *worst = 0;
  for (size_t i = 0; i < a.params().size(); ++i) {
    const float* x = a.params()[i].grad.data<float>();
    const float* y = b.params()[i].grad.data<float>();
    double num = 0, den = 0;
    for (int64_t j = 0; j < a.params()[i].grad.numel(); ++j) {
      num += (double(x[j]) - double(y[j])) * (double(x[j]) - double(y[j]));
      den += double(x[j]) * double(x[j]);
    }
    num_all += num;
    den_all += den;
    const double r = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (r > *worst) {
      *worst = r;
      *which = a.params()[i].name + " (norm " + std::to_string(std::sqrt(den)) + ")";
    }
  }
  return std::sqrt(num_all / den_all);
}
}  // namespace

// model.saved_dtype=bf16: the kept activations take about half the bytes (per-token statistics, the
// attention's q/k/v/o and KDA's decay gates stay fp32), the block equals activation_bytes, and the
// gradients differ from fp32 by bf16 rounding only. Tolerance: each rounded value is off by at most 2^-9
// (2e-3) relative; the measured relative L2 distance of all gradients together is 2.7e-3 (Olmo 3 tiny) to
// 6.3e-3 (hybrid tiny, remat attn), i.e. 1.4-3 x 2^-9; the bound is 10 x 2^-9 = 2e-2. Per tensor the worst is
// 6e-2, on the hybrid's SSMax gain whose gradient nearly cancels (norm 4e-4); the bound 2e-1 still catches
// a layer restored from the wrong bf16 copy (errors of order 1). The distance must not be 0: the rounding
// is really applied.
TEST(ModelUnits, Bf16SavedActivationsHalveTheirBytesAndPerturbGradientsByRoundingOnly) {
  set_threads(1);
  const int64_t T = 64;
  for (const char* fam : {"olmo3_tiny", "olmo3moe_tiny"}) {
    const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/" + fam + "/config.json");
    const Row r(T, c.vocab_size);
    LossConfig lc;
    lc.weight[model::kLossMoeLb] = 0.01;
    auto ref = make_model(c, 3);
    const LossParts p32 = ref->forward_backward(r.batch(), lc, 1.0 / double(T), 1.0);
    for (const Remat remat : {Remat::None, Remat::Attn}) {
      const MemoryPolicy bf{remat, SavedDtype::BF16}, fp{remat, SavedDtype::F32};
      auto m = make_model(c, 3);
      ASSERT_TRUE(m->set_memory_policy(bf));
      const LossParts p16 = m->forward_backward(r.batch(), lc, 1.0 / double(T), 1.0);
      EXPECT_EQ(p16.sum[model::kLossCe], p32.sum[model::kLossCe])
          << fam << ": the forward's numbers are fp32";
      std::string worst_name;
      double worst = 0;
      const double all = grad_rel_diff(*ref, *m, &worst, &worst_name);
      const ActivationBytes a16 = activation_bytes(c, 1, T, bf), a32 = activation_bytes(c, 1, T, fp);
      std::printf(
          "[units] %s remat %s bf16: saved %zu bytes (fp32 %zu, ratio %.3f); gradient rel L2 %.2e, worst "
          "tensor %.2e (%s)\n",
          fam, remat_name(remat), a16.saved, a32.saved, double(a16.saved) / double(a32.saved), all, worst,
          worst_name.c_str());
      EXPECT_GT(all, 0.0) << fam;
      EXPECT_LT(all, 2e-2) << fam;
      EXPECT_LT(worst, 2e-1) << fam << " " << worst_name;
      EXPECT_LT(double(a16.saved), 0.75 * double(a32.saved)) << fam;
      size_t planned = 0;
      if (auto* o3 = dynamic_cast<Decoder*>(m.get()))
        planned = o3->workspace_bytes();
      else
        planned = dynamic_cast<Decoder&>(*m).last_run().workspace_bytes + a16.kernels;
      EXPECT_EQ(planned, a16.total()) << fam;
    }
    auto m = make_model(c, 3);
    EXPECT_FALSE(m->set_memory_policy({Remat::Full, SavedDtype::BF16}))
        << fam << ": nothing to round under full";
  }
}
