// OLMo-core checkpoints: the model config (OLMo-core's config.json, whose `model` key holds
// TransformerConfig.as_config_dict()) turned into our HF config, OLMo-core parameter names mapped to the
// parameter registry (following OLMo-core's own HF conversion, olmo_core/nn/hf/convert.py), and a
// distributed checkpoint (io/distcp.h) read tensor by tensor under HF names. docs/io.md "OLMo-core".
#pragma once
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/distcp.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "model/params.h"

namespace olmosft::model::olmo_core {

// The HF config.json (model_type olmo3) equivalent to an OLMo-core config: either an experiment config
// with a `model` key or the TransformerConfig dict itself. Refuses, naming the key, every setting this
// mapping does not reproduce exactly (other block types, biases, fused projections, RoPE scaling, MoE).
nlohmann::json hf_config_json(const nlohmann::json& olmo_core_config, const std::string& context);
ModelConfig load_config(const std::string& config_json_path);

// HF name of an OLMo-core parameter name (without the checkpoint's "model." prefix); "" if none.
std::string hf_name(const std::string& olmo_core_name);

// The DCP directory of a step directory: STEP/model_and_optim when it holds .metadata, else STEP itself.
std::string dcp_dir_of(const std::string& step_dir);
// True when `dir` is an OLMo-core step directory (or its model_and_optim/).
bool is_olmo_core_dir(const std::string& dir);

// A step directory opened and checked against the registry: every registry tensor present under
// "model.<OLMo-core name>" with its shape, no other model.* tensor (optimizer state and byte entries are
// skipped without reading).
struct Checkpoint {
  ModelConfig config;
  std::vector<ParamSpec> registry;
  distcp::Checkpoint dcp;
  std::map<std::string, std::string> key_of;  // HF name -> distcp key

  // One tensor by HF name, in its stored dtype (read and reassembled from the shard files).
  Tensor read(const std::string& hf) const;
  uint64_t total_bytes() const;
  // Registry-ordered placeholders whose load() reads the tensor (for export_hf_dir, one tensor at a time).
  // `on_read(name, bytes)` is called after each read.
  std::vector<safetensors::NamedTensor> lazy_named(
      std::function<void(const std::string&, uint64_t)> on_read = nullptr) const;
};

// `config_json` "" means STEP/config.json.
Checkpoint open(const std::string& step_dir, const std::string& config_json = "");

// `olmosft model info` text for a step directory.
std::string model_info(const Checkpoint& c, const std::string& step_dir);

}  // namespace olmosft::model::olmo_core
