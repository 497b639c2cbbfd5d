// Model configuration: an HF config.json ("olmo3" = Olmo 3, "olmo3moe" = Olmo 3.5 hybrid KDA + latent MoE,
// "olmo_hybrid" = Olmo Hybrid 7B, Gated DeltaNet + attention, docs/olmo_hybrid.md) parsed into a validated
// ModelConfig (docs/reference/architecture.md A.1, B.1). Defaults are the HF configuration classes' defaults,
// except that the size-defining keys are required (see docs/io.md). The original JSON object is kept so that
// writing the config back changes only what must change.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace olmosft::model {

enum class ModelType { Olmo3, Olmo3Moe, OlmoHybrid };
enum class LayerType { SlidingAttention, FullAttention, LinearAttention };
const char* layer_type_name(LayerType t);  // HF spelling: sliding_attention, full_attention, linear_attention

// RoPE settings for one layer type (HF rope_parameters entry, resolved).
struct RopeParams {
  std::string rope_type = "default";  // "default", "linear" or "yarn"
  double rope_theta = 10000.0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // yarn: L0 (defaults to max_position_embeddings)
  double beta_fast = 32.0, beta_slow = 1.0;      // yarn
  double attention_factor = 1.0;                 // yarn: resolved (0.1 ln(factor) + 1 when absent)
  bool truncate = true;                          // yarn: floor/ceil the correction range
  bool operator==(const RopeParams&) const = default;
};

struct ModelConfig {
  ModelType model_type = ModelType::Olmo3;
  std::string model_type_name;  // "olmo3" / "olmo3moe" / "olmo_hybrid"
  // Shared.
  int64_t vocab_size = 0, hidden_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-5;
  int64_t max_position_embeddings = 2048;
  int64_t sliding_window = 4096;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  double attention_dropout = 0.0, initializer_range = 0.02;
  std::vector<LayerType> layer_types;
  // Special token ids (validated against vocab_size). eos_token_id may be a list in HF configs.
  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id, pad_token_id;
  // "torch_dtype" (or the newer "dtype") when given: the dtype the weights were saved in.
  std::optional<DType> torch_dtype;
  RopeParams rope_full, rope_sliding;  // per layer type (full_attention / sliding_attention)
  // Olmo 3 and Olmo Hybrid (dense SwiGLU).
  int64_t intermediate_size = 0;
  // Olmo Hybrid uses the linear_* keys below for its Gated DeltaNet layers and use_rope (false: rope_theta
  // null, NoPE).
  // Olmo 3.5 (olmo3moe).
  int64_t attention_hidden_size = 0;
  bool use_rope = true, use_head_qk_norm = false, qk_norm_per_head_gains = false, scalable_softmax = false;
  std::string attention_gate_type;  // "" (none) or "elementwise"
  bool attention_gate_full_precision = true;
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0, linear_key_head_dim = 0,
          linear_value_head_dim = 0, linear_conv_kernel_dim = 4;
  bool linear_allow_neg_eigval = false;
  double linear_norm_eps = 1e-5;
  int64_t n_routed_experts = 64, num_experts_per_tok = 4, moe_intermediate_size = 2048;
  int64_t latent_moe_dim = 0;                      // 0: no latent projection
  int64_t shared_expert_intermediate_size = 2048;  // 0: no shared expert
  int64_t dense_mlp_intermediate_size = 11008;
  std::optional<int64_t> original_num_experts_per_tok;
  bool latent_moe_bias = false, latent_moe_up_proj_input_norm = false;
  std::vector<int64_t> dense_layers_indices{0};
  bool dense_layers_use_shared_expert = false;
  std::string gating_function = "softmax";
  double normalize_expert_weights = 1.0;
  bool restore_weight_scale = true;
  double embed_scale = 1.0;
  bool embed_norm = false, use_peri_ln = false;
  std::optional<int64_t> emo_min_document_expert_pool, emo_max_document_expert_pool,
      emo_eval_document_expert_pool, emo_eos_token_id;
  bool global_load_balancing = false;
  // The config.json object as read (written back with only the necessary changes).
  nlohmann::json original;

  bool is_moe() const { return model_type == ModelType::Olmo3Moe; }
  bool is_dense_layer(int64_t layer) const;  // olmo3moe: dense FFN at this layer
  const RopeParams& rope_for(int64_t layer) const;
};

// Parses and validates; `context` (the file) is named in every error, together with the key.
ModelConfig parse_config(const nlohmann::json& j, const std::string& context);

ModelConfig load_config(const std::string& path);  // reads config.json

// One RoPE parameter object (a `rope_scaling` object, or one `rope_parameters` entry) as parse_config reads
// it: `rope_theta` is the config's top-level value (an entry may override it). Errors name `context`.
// model::olmo3_rope_frequencies turns the result into the kernel's RopeFreqs.
RopeParams parse_rope_params(const nlohmann::json& rope, const std::string& context, double rope_theta,
                             int64_t max_position_embeddings);

// The original JSON with only the necessary changes: `torch_dtype` (and `dtype` when the original has it)
// set to the exported dtype when one is given.
nlohmann::json config_to_json(const ModelConfig& c, std::optional<DType> export_dtype = std::nullopt);
void save_config(const ModelConfig& c, const std::string& path,
                 std::optional<DType> export_dtype = std::nullopt);
// HF torch dtype spelling ("bfloat16", "float32", "float16").
const char* torch_dtype_name(DType t);
// Multi-line human-readable summary.
std::string config_summary(const ModelConfig& c);

// Test and demo configurations (docs/reference/architecture.md A.1, B.1, D.1, D.2) as config.json objects:
// "olmo3-7b", "olmo3-tiny", "olmo3-small", "olmo3moe-small" (Olmo 3.5 small, vocab 100278),
// "olmo3moe-tiny", "olmo3moe-d2small", "olmo-hybrid-7b" (the released Olmo Hybrid 7B, NoPE),
// "olmo-hybrid-tiny" (RoPE on).
nlohmann::json preset_config_json(const std::string& name);
std::vector<std::string> preset_names();
// A config.json path (anything with a '/' or ending in .json) or a preset name; KEEP_LAYERS > 0 keeps only
// the first KEEP_LAYERS layers (and layer_types), e.g. a 7B-shaped short stack for compiles and benchmarks;
// too many is refused naming LAYERS_FLAG (the caller's option, e.g. "--layers").
ModelConfig config_from_path_or_preset(const std::string& config, int64_t keep_layers = 0,
                                       const std::string& layers_flag = "keep_layers");

}  // namespace olmosft::model
