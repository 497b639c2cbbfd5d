// Greedy decoding for any model::CausalLM (the demo's before/after answers, `olmosft generate`).
// Simple and exact rather than fast: there is no KV cache; every new token re-runs the full forward over the
// prompt and the tokens generated so far (cost O(new tokens x length) forwards), with up to `batch` prompts
// per forward, each in its own row, right-padded with segment -1. The next token is the argmax of the last
// position's logits over [0, valid_vocab) (lowest id on ties, as torch.argmax).
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace olmosft::train {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  int64_t batch = 8;              // prompts per forward (fewer when their logits would exceed ~1 GiB)
  int64_t valid_vocab = 0;        // argmax over ids < valid_vocab (0 = the model's vocab_size)
  std::vector<int32_t> stop_ids;  // a generated id in this list ends its sequence (and is kept in tokens)
};

struct Generation {
  std::vector<int32_t> tokens;  // generated ids, the stop id included when stopped
  bool stopped = false;         // ended on a stop id (false: max_new_tokens reached)
  int32_t stop_id = -1;
};

struct GenerateStats {
  int64_t forwards = 0;          // model.forward calls
  int64_t generated_tokens = 0;  // over all prompts
  double seconds = 0;
};

// Throws olmosft::Error on an empty prompt, an id outside the model's vocabulary, or a prompt +
// max_new_tokens longer than the model's max_position_embeddings.
std::vector<Generation> greedy_generate(model::CausalLM& model,
                                        const std::vector<std::vector<int32_t>>& prompts,
                                        const GenerateOptions& opts, GenerateStats* stats = nullptr);

}  // namespace olmosft::train
