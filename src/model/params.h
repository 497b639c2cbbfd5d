// The parameter registry: for a ModelConfig, the ordered list of HF tensor names with shapes
// (architecture.md A.5 for olmo3, B.9 for olmo3moe). Order = HF state-dict order (embeddings, layers in
// order, final norm, lm_head), which is also the export/sharding order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace olmosft::model {

struct ParamSpec {
  std::string name;  // HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
  Shape shape;
  int64_t layer = -1;             // -1 for global tensors
  bool routed_expert = false;     // olmo3moe routed-expert weight (counts top_k/E towards active params)
  bool fp32_master_only = false;  // kept in fp32 by the reference exporter (KDA A_log, dt_bias)
  bool decay = true;              // AdamW weight decay: matrices yes; norm gains and 1-D tensors no
};

std::vector<ParamSpec> param_registry(const ModelConfig& c);

struct ParamCounts {
  int64_t total = 0;   // every parameter
  int64_t active = 0;  // per token: all non-routed parameters + top_k / n_routed_experts of the routed ones
  size_t tensors = 0;
};
ParamCounts count_params(const ModelConfig& c);
ParamCounts count_params(const ModelConfig& c, const std::vector<ParamSpec>& registry);

}  // namespace olmosft::model
