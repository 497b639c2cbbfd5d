// The layer units' per-token declarations (saved_floats_per_token) against what the models really keep:
// the hybrid's measured saved bytes and Olmo 3's planned workspace.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "core/threads.h"
#include "model/config.h"
#include "model/model.h"
#include "model/olmo3.h"
#include "model/olmo3moe.h"
#include "model/unit_block.h"

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
    Batch b;
    b.B = 1;
    b.T = static_cast<int64_t>(tokens.size());
    b.tokens = tokens.data();
    b.segments = segments.data();
    b.positions = positions.data();
    b.targets = targets.data();
    b.trained = trained.data();
    return b;
  }
};

}  // namespace

TEST(ModelUnits, HybridSavedBytesMatchTheBlocksDeclarations) {
  set_threads(1);
  const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3moe_tiny/config.json");
  auto m = make_model(c, 3);
  const int64_t T = 64;
  const Row r(T, c.vocab_size);
  LossConfig lc;
  m->forward_backward(r.batch(), lc, 1.0 / double(T), 1.0);
  const size_t saved = dynamic_cast<Olmo3MoeModel&>(*m).last_run().saved_bytes;
  int64_t declared = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    declared += unit::PeriLnBlock::saved_floats_per_token(c, l);
  std::printf("[units] hybrid tiny: saved %.1f bytes/token, declared %lld floats/token (%lld bytes)\n",
              double(saved) / double(T), static_cast<long long>(declared),
              static_cast<long long>(4 * declared));
  // The declaration counts every saved value as a float; the MoE cache keeps its `kept` flags as bytes
  // and its per-expert loads per layer (not per token).
  EXPECT_GE(4.0 * double(declared) * double(T), 0.99 * double(saved));
  EXPECT_LE(4.0 * double(declared) * double(T), 1.01 * double(saved));
}

TEST(ModelUnits, Olmo3WorkspaceMatchesTheDeclarations) {
  set_threads(1);
  const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3_tiny/config.json");
  auto m = make_model(c, 3);
  const int64_t T = 64;
  const Row r(T, c.vocab_size);
  LossConfig lc;
  m->forward_backward(r.batch(), lc, 1.0 / double(T), 1.0);
  auto& o3 = dynamic_cast<Olmo3&>(*m);
  const int64_t per_token = Olmo3::activation_floats_per_token(c);
  const int64_t saved_per_token = c.num_hidden_layers * unit::PostNormBlock::saved_floats_per_token(c);
  std::printf(
      "[units] olmo3 tiny: saved by the blocks %lld floats/token (%lld bytes), workspace %lld floats/token\n",
      static_cast<long long>(saved_per_token), static_cast<long long>(4 * saved_per_token),
      static_cast<long long>(per_token));
  // The planned block: the declared floats per token, each buffer rounded up to 64 bytes.
  const double block = double(o3.workspace_bytes());
  EXPECT_GE(block, 4.0 * double(per_token * T));
  EXPECT_LE(block, 4.0 * double(per_token * T) * 1.5 + 1e6);  // + rounding, attention workspace, seg/pos
}
