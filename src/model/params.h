// The parameter registry: for a ModelConfig, the ordered list of HF tensor names with shapes
// (docs/reference/architecture.md A.5 for olmo3, B.9 for olmo3moe). Order = HF state-dict order (embeddings,
// layers in order, final norm, lm_head), which is also the export/sharding order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/layers.h"

namespace olmosft::model {

// HF tensor names, spelled only here: the layer units (model/unit_*.cpp), which declare the registry's rows,
// and the models build every name from these (docs/reference/architecture.md A.5, B.9).
namespace hf {
inline constexpr const char* kLayersPrefix = "model.layers.";
std::string layer(int64_t l);                               // "model.layers.<l>."
int64_t layer_of(const std::string& name);                  // l of "model.layers.<l>.…", else -1
inline constexpr const char* kSelfAttn = "self_attn.";      // under layer(l): attention and KDA mixers
inline constexpr const char* kLinearAttn = "linear_attn.";  // under layer(l): the GDN mixer (olmo_hybrid)
inline constexpr const char* kMlp = "mlp.";                 // under layer(l): the FFN
std::string expert(int64_t e);                              // under kMlp: "experts.<e>."
inline constexpr const char* kEmbedTokens = "model.embed_tokens.weight";
inline constexpr const char* kEmbedNorm = "model.embed_norm.weight";
inline constexpr const char* kFinalNorm = "model.norm.weight";
inline constexpr const char* kLmHead = "lm_head.weight";
inline constexpr const char* kPreAttnNorm = "pre_attention_layernorm.weight";
inline constexpr const char* kPostAttnNorm = "post_attention_layernorm.weight";
inline constexpr const char* kPreFfnNorm = "pre_feedforward_layernorm.weight";
inline constexpr const char* kPostFfnNorm = "post_feedforward_layernorm.weight";
inline constexpr const char* kInputNorm = "input_layernorm.weight";  // olmo_hybrid GDN layers: pre-mixer
// A block's norms by placement (LayerSpec::pre_norm / post_norm), nullptr where absent: post-norm
// {-, post_attention, -, post_feedforward}; peri-LN all four; pre-norm (olmo_hybrid's GDN layers)
// {input_layernorm, -, post_attention_layernorm (before the FFN), -}.
struct BlockNorms {
  const char *pre_attn, *post_attn, *pre_ffn, *post_ffn;
};
BlockNorms block_norms(const LayerSpec& s);
inline constexpr const char* kQProj = "q_proj.weight";
inline constexpr const char* kKProj = "k_proj.weight";
inline constexpr const char* kVProj = "v_proj.weight";
inline constexpr const char* kOProj = "o_proj.weight";
inline constexpr const char* kQNorm = "q_norm.weight";
inline constexpr const char* kKNorm = "k_norm.weight";
inline constexpr const char* kGProj = "g_proj.weight";
inline constexpr const char* kSsmaxScale = "ssmax_scale";
inline constexpr const char* kFProj1 = "f_proj_1.weight";
inline constexpr const char* kFProj2 = "f_proj_2.weight";
inline constexpr const char* kBetaProj = "beta_proj.weight";
inline constexpr const char* kALog = "A_log";
inline constexpr const char* kDtBias = "dt_bias";
inline constexpr const char* kQConv = "q_conv1d.weight";
inline constexpr const char* kKConv = "k_conv1d.weight";
inline constexpr const char* kVConv = "v_conv1d.weight";
inline constexpr const char* kGProj1 = "g_proj_1.weight";
inline constexpr const char* kGProj2 = "g_proj_2.weight";
inline constexpr const char* kGProj2Bias = "g_proj_2.bias";
inline constexpr const char* kONorm = "o_norm.weight";
inline constexpr const char* kAProj = "a_proj.weight";   // GDN: decay input, one per head
inline constexpr const char* kBProj = "b_proj.weight";   // GDN: beta logits
inline constexpr const char* kConv1d = "conv1d.weight";  // GDN: fused depthwise conv over [q | k | v]
// How a stored tensor name of an olmo_hybrid checkpoint maps to a registry name on import (transformers
// 5.23's save_pretrained writes attention_layer_norm / feedforward_layer_norm and splits conv1d into
// q/k/v_conv1d; OLMo-core 3.0's exporter writes linear_attn.out_proj / norm): the registry name, and for a
// tensor stored in pieces along dim 0, this piece's index and the piece count. nullopt: not an alias.
struct ImportAlias {
  std::string name;
  int piece = 0, pieces = 1;
};
std::optional<ImportAlias> import_alias(const ModelConfig& c, const std::string& stored);
inline constexpr const char* kGateProj = "gate_proj.weight";
inline constexpr const char* kUpProj = "up_proj.weight";
inline constexpr const char* kDownProj = "down_proj.weight";
inline constexpr const char* kRouter = "router.gate.weight";
inline constexpr const char* kLatentDown = "latent_down_proj.weight";
inline constexpr const char* kLatentUp = "latent_up_proj.weight";
std::string shared_expert(const char* proj);  // under kMlp: "shared_expert.<proj>"
}  // namespace hf

struct ParamSpec {
  std::string name;  // HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
  Shape shape;
  int64_t layer = -1;             // -1 for global tensors
  bool routed_expert = false;     // olmo3moe routed-expert weight (counts top_k/E towards active params)
  bool fp32_master_only = false;  // kept in fp32 by the reference exporter (KDA A_log, dt_bias)
  bool decay = true;              // AdamW weight decay: matrices yes; norm gains and 1-D tensors no
};

// The units' declarations (unit.h Params) in order: the embedding's, each layer's block (layer_list: its
// tensors in LayerSpec::hf_order), the LM head's.
std::vector<ParamSpec> param_registry(const ModelConfig& c);

struct ParamCounts {
  int64_t total = 0;   // every parameter
  int64_t active = 0;  // per token: all non-routed parameters + top_k / n_routed_experts of the routed ones
  size_t tensors = 0;
};
ParamCounts count_params(const ModelConfig& c);
ParamCounts count_params(const ModelConfig& c, const std::vector<ParamSpec>& registry);

}  // namespace olmosft::model
