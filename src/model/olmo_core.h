// OLMo-core checkpoints: the model config (OLMo-core's config.json, whose `model` key holds
// TransformerConfig.as_config_dict()) turned into our HF config, OLMo-core parameter names mapped to the
// parameter registry (following OLMo-core's own HF conversion, olmo_core/nn/hf/convert.py), and a
// distributed checkpoint (io/distcp.h) read tensor by tensor under HF names. docs/io.md "OLMo-core".
#pragma once
#include <functional>
#include <map>
#include <memory>
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

// HF name of an OLMo-core parameter name (without the checkpoint's "model." prefix) of an Olmo 3 dense model;
// "" if none.
std::string hf_name(const std::string& olmo_core_name);

// How one HF tensor is cut from one OLMo-core parameter (olmo_core/nn/hf/convert.py,
// convert_olmo3moe_state_to_hf): the whole tensor (reshaped: the router is stored flat [E * d]), one expert's
// half of the fused routed [E, 2H, L] w_up_gate (up rows first, then gate), one expert's w_down [E, H, L]
// transposed, or a half of the shared / dense [d, 2S] w_up_gate or the [1, S, d] w_down, transposed.
enum class Cut { Whole, ExpertUp, ExpertGate, ExpertDownT, UpT, GateT, DownT };
struct Source {
  std::string name;  // OLMo-core parameter name, e.g. "blocks.1.routed_experts.w_up_gate"; "" if none
  Cut cut = Cut::Whole;
  int64_t expert = -1;
  Shape shape;     // the OLMo-core parameter's shape (a checkpoint may store it flattened: "<name>.main")
  Shape hf_shape;  // the registry tensor's shape (set when bound to a checkpoint)
};
// The source of a registry tensor under `c` (olmo3 or olmo3moe).
Source source_of(const ParamSpec& p, const ModelConfig& c);

// The DCP directory of a step directory: STEP/model_and_optim when it holds .metadata, else STEP itself.
std::string dcp_dir_of(const std::string& step_dir);
// True when `dir` is an OLMo-core step directory (or its model_and_optim/).
bool is_olmo_core_dir(const std::string& dir);

// A step directory opened and checked against the registry: every OLMo-core parameter the registry needs is
// present with its shape, under "model.<name>" (save_model_and_optim_state; "model.module.<name>" too) or as
// the flattened float32 master "<name>.main" / "module.<name>.main"
// (OLMoDDPTrainModule.save_state_dict_direct, the hybrid's trainer), and no other model parameter is
// (optimizer state, buffers and byte entries are skipped without reading).
struct SourceCache;
struct Checkpoint {
  ModelConfig config;
  std::vector<ParamSpec> registry;
  distcp::Checkpoint dcp;
  std::map<std::string, std::string> key_of;  // HF name -> distcp key (several HF names may share one key)
  std::map<std::string, Source> source;       // HF name -> how it is cut from that key's tensor
  std::shared_ptr<SourceCache> cache;         // the last fused tensors read (experts: w_up_gate and w_down)

  // One tensor by HF name, in its stored dtype (read and reassembled from the shard files, then cut). Memory:
  // the tensor, plus for routed experts the layer's two fused expert tensors (read once for all experts).
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
