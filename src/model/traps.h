// The runbook's traps that a model's config.json alone can show (docs/model.md "Trap checks"), per family:
// which layers rotate q/k and how (YaRN on Olmo 3's full_attention layers only; Olmo Hybrid's NoPE unless
// rope_theta is given; the Olmo 3.5 hybrid's NoPE), the dolma2 special-token ids of a full-size vocabulary
// (eos 100257, pad 100277), and a vocabulary that no tokenizer id falls outside. `olmosft check model` prints
// them, with the tokenizer comparisons when given one.
#pragma once
#include <string>
#include <vector>

#include "model/config.h"

namespace olmosft::model {

struct TrapCheck {
  enum Level { Ok, Warn, Fail } level = Ok;
  std::string what;    // the check, e.g. "rope"
  std::string detail;  // what the config says, and why it matters when not Ok
};

std::vector<TrapCheck> config_trap_checks(const ModelConfig& c);

// Against a tokenizer's ids: eos among the config's eos_token_id, pad equal to pad_token_id, every token id
// inside the model's vocabulary.
std::vector<TrapCheck> tokenizer_trap_checks(const ModelConfig& c, int64_t tok_eos, int64_t tok_pad,
                                             int64_t tok_vocab);

}  // namespace olmosft::model
