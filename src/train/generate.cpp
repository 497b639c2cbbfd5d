#include "train/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "train/batch.h"

namespace olmosft::train {

namespace {
constexpr double kLogitsBudget = 1024.0 * 1024.0 * 1024.0;  // bytes of logits per forward
}  // namespace

std::vector<Generation> greedy_generate(model::CausalLM& model,
                                        const std::vector<std::vector<int32_t>>& prompts,
                                        const GenerateOptions& opts, GenerateStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  const model::ModelConfig& cfg = model.config();
  const int64_t V = cfg.vocab_size;
  const int64_t valid = opts.valid_vocab > 0 ? std::min(opts.valid_vocab, V) : V;
  OLMO_CHECK(opts.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", opts.max_new_tokens);
  OLMO_CHECK(opts.batch >= 1, "generate: batch must be >= 1, got ", opts.batch);
  for (size_t p = 0; p < prompts.size(); ++p) {
    OLMO_CHECK(!prompts[p].empty(), "generate: prompt ", p, " is empty");
    for (size_t t = 0; t < prompts[p].size(); ++t)
      OLMO_CHECK(prompts[p][t] >= 0 && prompts[p][t] < V, "generate: prompt ", p, ", position ", t,
                 ": token id ", prompts[p][t], " is outside the model's vocabulary [0, ", V, ")");
    const int64_t need = static_cast<int64_t>(prompts[p].size()) + opts.max_new_tokens;
    OLMO_CHECK(cfg.max_position_embeddings <= 0 || need <= cfg.max_position_embeddings, "generate: prompt ",
               p, " has ", prompts[p].size(), " tokens; with max_new_tokens=", opts.max_new_tokens,
               " it would exceed the model's max_position_embeddings ", cfg.max_position_embeddings);
  }
  // The forward writes every position's logits: cap them near 1 GiB by taking fewer prompts per forward.
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  const double row_bytes = 4.0 * static_cast<double>(V) * static_cast<double>(longest + opts.max_new_tokens);
  const int64_t rows =
      std::max<int64_t>(1, std::min<int64_t>(opts.batch, static_cast<int64_t>(kLogitsBudget / row_bytes)));
  std::vector<Generation> out(prompts.size());
  GenerateStats st;
  std::vector<float> logits;
  model::LossConfig lc;
  for (size_t c0 = 0; c0 < prompts.size(); c0 += static_cast<size_t>(rows)) {
    const size_t c1 = std::min(prompts.size(), c0 + static_cast<size_t>(rows));
    std::vector<size_t> active;
    for (size_t p = c0; p < c1; ++p) active.push_back(p);
    for (int64_t step = 0; step < opts.max_new_tokens && !active.empty(); ++step) {
      const int64_t B = static_cast<int64_t>(active.size());
      int64_t T = 0;
      for (size_t p : active)
        T = std::max<int64_t>(T, static_cast<int64_t>(prompts[p].size() + out[p].tokens.size()));
      const size_t N = static_cast<size_t>(B * T);
      std::vector<int32_t> ids(N, 0), seg(N, -1), pos(N, 0), tgt(N, -100);
      std::vector<uint8_t> trained(N, 0);
      std::vector<int64_t> last(static_cast<size_t>(B));
      for (int64_t b = 0; b < B; ++b) {
        const size_t p = active[static_cast<size_t>(b)];
        int64_t t = 0;
        for (int32_t id : prompts[p]) {
          ids[static_cast<size_t>(b * T + t)] = id;
          seg[static_cast<size_t>(b * T + t)] = 0;
          pos[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(t);
          ++t;
        }
        for (int32_t id : out[p].tokens) {
          ids[static_cast<size_t>(b * T + t)] = id;
          seg[static_cast<size_t>(b * T + t)] = 0;
          pos[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(t);
          ++t;
        }
        last[static_cast<size_t>(b)] = b * T + t - 1;
      }
      const model::Batch batch = batch_view(B, T, ids, seg, pos, tgt, trained);
      logits.resize(N * static_cast<size_t>(V));
      model.forward(batch, lc, logits.data(), nullptr);
      ++st.forwards;
      std::vector<size_t> still;
      for (int64_t b = 0; b < B; ++b) {
        const size_t p = active[static_cast<size_t>(b)];
        const float* row =
            logits.data() + static_cast<size_t>(last[static_cast<size_t>(b)]) * static_cast<size_t>(V);
        const int32_t next = static_cast<int32_t>(std::max_element(row, row + valid) - row);
        OLMO_CHECK(std::isfinite(row[next]), "generate: non-finite logits for prompt ", p, " at new token ",
                   step);
        out[p].tokens.push_back(next);
        ++st.generated_tokens;
        if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), next) != opts.stop_ids.end()) {
          out[p].stopped = true;
          out[p].stop_id = next;
        } else {
          still.push_back(p);
        }
      }
      active = std::move(still);
    }
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stats) *stats = st;
  return out;
}

}  // namespace olmosft::train
