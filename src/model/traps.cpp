// Trap checks of a model config (see traps.h).
#include "model/traps.h"

#include <algorithm>
#include <sstream>

#include "model/layers.h"
#include "model/unit_block.h"

namespace olmosft::model {

namespace {

constexpr int64_t kDolma2Vocab = 100278, kDolma2Eos = 100257, kDolma2Pad = 100277;

std::string rope_text(const RopeParams& r) {
  std::ostringstream os;
  os << r.rope_type << " theta " << r.rope_theta;
  if (r.rope_type == "yarn")
    os << " factor " << r.factor << " original " << r.original_max_position_embeddings;
  return os.str();
}

// Which layers rotate q/k, as layer_specs applies it, and the family's known-good setting.
TrapCheck rope_check(const ModelConfig& c) {
  int64_t full = 0, sliding = 0, none = 0;
  for (const LayerSpec& s : layer_specs(c)) {
    if (s.mixer != unit::kMixer<unit::AttentionUnit>) continue;
    (s.rope == RopeKind::Full ? full : s.rope == RopeKind::Sliding ? sliding : none) += 1;
  }
  std::ostringstream os;
  if (full) os << full << " full_attention layers " << rope_text(c.rope_full) << "; ";
  if (sliding) os << sliding << " sliding_attention layers " << rope_text(c.rope_sliding) << "; ";
  if (none) os << none << " attention layers without RoPE (NoPE); ";
  std::string detail = os.str();
  if (detail.size() >= 2) detail.resize(detail.size() - 2);  // the last "; "
  TrapCheck t{TrapCheck::Ok, "rope", detail};
  if (c.model_type == ModelType::Olmo3 && c.rope_sliding.rope_type != "default") {
    t.level = TrapCheck::Fail;
    t.detail +=
        "Olmo 3 applies YaRN/scaling to full_attention layers only (the runbook's YaRN trap: +0.1 "
        "nats/token when the sliding layers are scaled too)";
  }
  const bool full_size = c.vocab_size >= kDolma2Vocab;
  if (c.model_type == ModelType::OlmoHybrid && c.use_rope && full_size) {
    t.level = TrapCheck::Warn;
    t.detail +=
        "the released Olmo Hybrid checkpoints are NoPE (rope_parameters.rope_theta null); RoPE is on "
        "here, as it is in transformers whenever rope_theta is not null (a config written without "
        "the rope key turns it on)";
  }
  return t;
}

TrapCheck special_ids_check(const ModelConfig& c) {
  std::ostringstream os;
  os << "eos";
  for (int64_t e : c.eos_token_ids) os << " " << e;
  os << (c.eos_token_ids.empty() ? " none" : "") << ", pad "
     << (c.pad_token_id ? std::to_string(*c.pad_token_id) : "none");
  TrapCheck t{TrapCheck::Ok, "special token ids", os.str()};
  if (c.vocab_size < kDolma2Vocab) return t;  // a test vocabulary
  const bool eos =
      std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), kDolma2Eos) != c.eos_token_ids.end();
  if (!eos || c.pad_token_id != kDolma2Pad) {
    t.level = TrapCheck::Fail;
    t.detail += "; a dolma2-size vocabulary expects eos 100257 (<|endoftext|>) and pad 100277 (<|pad|>)";
  }
  return t;
}

}  // namespace

std::vector<TrapCheck> config_trap_checks(const ModelConfig& c) {
  std::vector<TrapCheck> v{rope_check(c), special_ids_check(c)};
  v.push_back({TrapCheck::Ok, "vocabulary",
               std::to_string(c.vocab_size) + " rows, never padded: the softmax runs over all of them"});
  return v;
}

std::vector<TrapCheck> tokenizer_trap_checks(const ModelConfig& c, int64_t tok_eos, int64_t tok_pad,
                                             int64_t tok_vocab) {
  std::vector<TrapCheck> v;
  const bool eos =
      std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), tok_eos) != c.eos_token_ids.end();
  v.push_back({eos ? TrapCheck::Ok : TrapCheck::Fail, "eos matches the tokenizer",
               "tokenizer eos " + std::to_string(tok_eos) +
                   (eos ? "" : ": not among the config's eos_token_id (generation would not stop)")});
  const bool pad = c.pad_token_id == tok_pad;
  v.push_back(
      {pad ? TrapCheck::Ok : TrapCheck::Fail, "pad matches the tokenizer",
       "tokenizer pad " + std::to_string(tok_pad) + (pad ? "" : ": differs from the config's pad_token_id")});
  const bool fits = tok_vocab <= c.vocab_size;
  v.push_back(
      {fits ? TrapCheck::Ok : TrapCheck::Fail, "tokenizer ids inside the vocabulary",
       "tokenizer " + std::to_string(tok_vocab) + " ids, model " + std::to_string(c.vocab_size) + " rows"});
  return v;
}

}  // namespace olmosft::model
