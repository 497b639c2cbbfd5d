// The decoder's layer list (see layers.h).
#include "model/layers.h"

#include <string>

#include "core/error.h"
#include "model/unit_block.h"

namespace olmosft::model {

namespace {

void check_olmo3(const ModelConfig& c) {
  OLMO_CHECK(c.hidden_act == "silu", "Olmo3: hidden_act '", c.hidden_act, "' is not supported (silu)");
  OLMO_CHECK(!c.tie_word_embeddings, "Olmo3: tie_word_embeddings=true is not supported");
  OLMO_CHECK(!c.attention_bias, "Olmo3: attention_bias=true is not supported");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerType t = c.layer_types.at(static_cast<size_t>(l));
    OLMO_CHECK(t == LayerType::SlidingAttention || t == LayerType::FullAttention, "Olmo3: layer ", l,
               " has type ", layer_type_name(t), " (olmo3 has sliding_attention and full_attention only)");
  }
}

void check_olmo3moe(const ModelConfig& c) {
  const std::string ctx = "olmo3moe config";
  OLMO_CHECK(c.use_peri_ln, ctx, ": use_peri_ln=false is not supported (expected true)");
  OLMO_CHECK(!c.use_rope, ctx, ": use_rope=true is not supported by the hybrid (expected false: NoPE)");
  OLMO_CHECK(c.gating_function == "softmax", ctx, ": gating_function '", c.gating_function,
             "' is not supported (expected softmax)");
  OLMO_CHECK(c.normalize_expert_weights == 1.0, ctx, ": normalize_expert_weights ",
             c.normalize_expert_weights, " is not supported (expected 1.0: L1)");
  OLMO_CHECK(c.restore_weight_scale, ctx, ": restore_weight_scale=false is not supported (expected true)");
  OLMO_CHECK(!c.latent_moe_bias, ctx, ": latent_moe_bias=true is not supported (expected false)");
  OLMO_CHECK(!c.latent_moe_up_proj_input_norm, ctx, ": latent_moe_up_proj_input_norm=true is not supported");
  OLMO_CHECK(c.attention_gate_type.empty() || c.attention_gate_type == "elementwise", ctx,
             ": attention_gate_type '", c.attention_gate_type,
             "' is not supported (expected elementwise or none)");
  OLMO_CHECK(c.linear_num_key_heads == c.linear_num_value_heads, ctx, ": linear_num_key_heads (",
             c.linear_num_key_heads, ") must equal linear_num_value_heads (", c.linear_num_value_heads, ")");
  OLMO_CHECK(c.hidden_act == "silu", ctx, ": hidden_act '", c.hidden_act,
             "' is not supported (expected silu)");
}

void check_olmo_hybrid(const ModelConfig& c) {
  const std::string ctx = "olmo_hybrid config";
  OLMO_CHECK(c.hidden_act == "silu", ctx, ": hidden_act '", c.hidden_act,
             "' is not supported (expected silu)");
  OLMO_CHECK(!c.attention_bias, ctx, ": attention_bias=true is not supported");
  OLMO_CHECK(c.linear_num_key_heads > 0 && c.linear_num_value_heads % c.linear_num_key_heads == 0, ctx,
             ": linear_num_value_heads (", c.linear_num_value_heads,
             ") must be a multiple of linear_num_key_heads (", c.linear_num_key_heads, ")");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    OLMO_CHECK(c.layer_types.at(static_cast<size_t>(l)) != LayerType::SlidingAttention, ctx, ": layer ", l,
               " is sliding_attention (olmo_hybrid has linear_attention and full_attention only)");
}

}  // namespace

void check_supported(const ModelConfig& c) {
  if (c.model_type == ModelType::Olmo3)
    check_olmo3(c);
  else if (c.model_type == ModelType::OlmoHybrid)
    check_olmo_hybrid(c);
  else
    check_olmo3moe(c);
  bool attention = false;  // GQA needs the query heads in whole groups (only where a layer attends)
  for (const LayerType t : c.layer_types) attention = attention || t != LayerType::LinearAttention;
  OLMO_CHECK(!attention || (c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0),
             c.model_type_name, ": num_attention_heads ", c.num_attention_heads,
             " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
}

std::vector<LayerSpec> layer_specs(const ModelConfig& c) {
  check_supported(c);
  return layer_list(c);
}

std::vector<LayerSpec> layer_list(const ModelConfig& c) {
  using unit::kMixer;
  const bool olmo3 = c.model_type == ModelType::Olmo3, hybrid = c.model_type == ModelType::OlmoHybrid;
  std::vector<LayerSpec> v;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerType t = c.layer_types.at(static_cast<size_t>(l));
    const bool linear = t == LayerType::LinearAttention;
    LayerSpec s;
    s.index = l;
    s.mixer = !linear ? kMixer<unit::AttentionUnit> : hybrid ? kMixer<unit::GdnUnit> : kMixer<unit::KdaUnit>;
    s.window = t == LayerType::SlidingAttention ? c.sliding_window : 0;
    // Olmo 3 rotates q and k (YaRN on full_attention layers); Olmo 3.5's attention is NoPE; Olmo Hybrid's
    // full_attention layers rotate unless rope_theta is null
    if (olmo3) s.rope = t == LayerType::SlidingAttention ? RopeKind::Sliding : RopeKind::Full;
    if (hybrid && !linear && c.use_rope) s.rope = RopeKind::Full;
    // Olmo Hybrid: pre-norm GDN layers, post-norm (Olmo 3) attention layers
    s.pre_norm = hybrid ? linear : c.use_peri_ln;
    s.post_norm = !(hybrid && linear);
    s.ffn = c.is_dense_layer(l) ? FfnKind::SwiGlu : FfnKind::Moe;
    s.ffn_hidden = c.is_moe() ? c.dense_mlp_intermediate_size : c.intermediate_size;
    // HF module order: Olmo3MoeDecoderLayer registers its four norms first; OlmoHybrid's GDN layers
    // mlp, the norms, then linear_attn; Olmo 3's (and OlmoHybrid's attention layers) self_attn, mlp, norms
    using P = LayerPart;
    if (c.is_moe()) s.hf_order = {P::Norms, P::Mixer, P::Ffn};
    if (hybrid && linear) s.hf_order = {P::Ffn, P::Norms, P::Mixer};
    v.push_back(s);
  }
  return v;
}

bool has_ffn(const std::vector<LayerSpec>& layers, FfnKind f) {
  for (const LayerSpec& s : layers)
    if (s.ffn == f) return true;
  return false;
}

bool uses_rope(const std::vector<LayerSpec>& layers) {
  for (const LayerSpec& s : layers)
    if (s.rope != RopeKind::None) return true;
  return false;
}

}  // namespace olmosft::model
