// OLMo-core's OLMoDDPModelConfig (TransformerType "moe_fused_v2", blocks OLMoDDPTransformerBlockConfig: the
// Olmo 3.5 hybrid) as an HF olmo3moe config.json, key by key after OLMo-core 3.0's own HF export
// (olmo_core/nn/hf/config.py _get_olmo3moe_kda_emo_config), refusing by name what that export refuses or what
// the HF model does not compute. docs/io.md "OLMo-core".
#include <cmath>
#include <map>
#include <vector>

#include "model/olmo_core_cfg.h"

namespace olmosft::model::olmo_core {

namespace {

struct Layer {
  std::string path;  // "model.block.<name>" (or "model.block") for errors
  const json* block;
};

// One block config per layer: model.block is one OLMoDDPTransformerBlockConfig or a dict of named ones cycled
// by model.block_pattern (OLMo-core's resolve_block_configs).
std::vector<Layer> resolve_layers(const Cfg& c, const json& m, int64_t n_layers) {
  c.must_be_null(m, "model", "block_overrides", "per-layer overrides; use named blocks and block_pattern");
  const json& block = c.get(m, "model", "block");
  OLMO_CHECK(block.is_object(), c.ctx, ": model.block must be an object");
  std::vector<Layer> out;
  if (block.contains("sequence_mixer") || block.contains("attention")) {
    c.must_be_null(m, "model", "block_pattern", "a single block config has no pattern");
    for (int64_t l = 0; l < n_layers; ++l) out.push_back({"model.block", &block});
    return out;
  }
  const json* pat = c.opt(m, "block_pattern");
  OLMO_CHECK(pat && pat->is_array() && !pat->empty(), c.ctx,
             ": model.block is a dict of named blocks, so model.block_pattern must be a non-empty list");
  for (int64_t l = 0; l < n_layers; ++l) {
    const json& name = (*pat)[size_t(l) % pat->size()];
    OLMO_CHECK(name.is_string() && block.contains(name.get<std::string>()), c.ctx,
               ": model.block_pattern entry ", name.dump(), " names no block in model.block");
    const std::string n = name.get<std::string>();
    out.push_back({"model.block." + n, &block.at(n)});
  }
  return out;
}

// An RMSNorm config (bias-free); returns its eps.
double rms_eps(const Cfg& c, const json& ln, const std::string& path) {
  c.must_be(ln, path, "name", "rms", "RMSNorm");
  c.must_be_null(ln, path, "bias", "HF olmo3moe norms have no bias");
  return c.get(ln, path, "eps").is_null() ? 1e-5 : c.number(ln, path, "eps");
}

// Keys that must agree across the layers of one kind: the first layer's value is kept, later ones compared.
struct Agree {
  const Cfg& c;
  json& hf;
  void set(const char* key, const json& v, const std::string& path) {
    if (!hf.contains(key)) {
      hf[key] = v;
      return;
    }
    OLMO_CHECK(hf[key] == v, c.ctx, ": ", path, " gives ", key, " = ", v.dump(),
               " but an earlier layer gave ", hf[key].dump(), " (the HF olmo3moe config has one value)");
  }
};

void kda_layer(const Cfg& c, const json& mx, const std::string& p, int64_t d, Agree& a) {
  const int64_t heads = c.integer(mx, p, "n_heads");
  const int64_t v_heads = c.opt(mx, "n_v_heads") ? c.integer(mx, p, "n_v_heads") : heads;
  const int64_t dk = c.opt(mx, "head_dim") ? c.integer(mx, p, "head_dim") : d / heads;
  const double expand = c.opt(mx, "expand_v") ? c.number(mx, p, "expand_v") : 1.0;
  const double dv = double(dk) * expand;
  OLMO_CHECK(dv >= 1 && dv == std::floor(dv), c.ctx, ": ", p, ".expand_v ", expand,
             " does not give an integer value-head dim");
  c.must_be_null(mx, p, "conv_bias", "OLMo-core's HF export has no KDA convolution bias");
  a.set("linear_num_key_heads", heads, p);
  a.set("linear_num_value_heads", v_heads, p);
  a.set("linear_key_head_dim", dk, p);
  a.set("linear_value_head_dim", int64_t(dv), p);
  a.set("linear_conv_kernel_dim", c.opt(mx, "conv_size") ? c.integer(mx, p, "conv_size") : 4, p);
  a.set("linear_allow_neg_eigval", c.boolean(mx, p, "allow_neg_eigval", false), p);
  a.set("linear_norm_eps", c.opt(mx, "norm_eps") ? c.number(mx, p, "norm_eps") : 1e-5, p);
}

void attention_layer(const Cfg& c, const json& mx, const std::string& p, double eps, Agree& a) {
  c.must_be(mx, p, "name", "default", "separate w_q/w_k/w_v (fused_v2 and fused projections are not mapped)");
  c.must_be_null(mx, p, "bias", "HF olmo3moe attention has no biases");
  c.must_be_null(mx, p, "clip_qkv", "not in the HF model");
  c.must_be_null(mx, p, "attention_sinks", "not in the HF model");
  c.must_be_null(mx, p, "sliding_window", "OLMo-core's hybrid HF export has no sliding-window attention");
  c.must_be_null(mx, p, "use_mla", "not in the HF model");
  OLMO_CHECK(c.boolean(mx, p, "use_head_qk_norm", false), c.ctx, ": ", p,
             ".use_head_qk_norm must be true (OLMo-core's HF export requires head-wise q/k norms)");
  const json* qk = c.opt(mx, "qk_norm");
  OLMO_CHECK(qk, c.ctx, ": ", p, ".qk_norm is missing (the HF olmo3moe attention normalises q and k)");
  OLMO_CHECK(rms_eps(c, *qk, p + ".qk_norm") == eps, c.ctx, ": ", p,
             ".qk_norm.eps differs from the block norms' eps (the HF config has one rms_norm_eps)");
  const int64_t heads = c.integer(mx, p, "n_heads");
  a.set("num_attention_heads", heads, p);
  a.set("num_key_value_heads", c.opt(mx, "n_kv_heads") ? c.integer(mx, p, "n_kv_heads") : heads, p);
  a.set("head_dim", c.integer(mx, p, "head_dim"), p);
  a.set("attention_hidden_size", heads * c.integer(mx, p, "head_dim"), p);
  a.set("use_head_qk_norm", true, p);
  a.set("qk_norm_per_head_gains", c.boolean(mx, p, "qk_norm_per_head_gains", false), p);
  a.set("scalable_softmax", c.boolean(mx, p, "scalable_softmax", false), p);
  if (const json* g = c.opt(mx, "gate")) {
    c.must_be(*g, p + ".gate", "granularity", "elementwise", "the gate the HF model implements");
    a.set("attention_gate_type", "elementwise", p);
    a.set("attention_gate_full_precision", c.boolean(*g, p + ".gate", "full_precision", true), p);
  } else {
    a.set("attention_gate_type", nullptr, p);
  }
  const json* rope = c.opt(mx, "rope");
  a.set("use_rope", rope != nullptr, p);
  if (rope) {
    c.must_be(*rope, p + ".rope", "name", "default", "standard RoPE");
    c.must_be_null(*rope, p + ".rope", "scaling", "RoPE scaling is not mapped for the hybrid");
    a.set("rope_theta", c.number(*rope, p + ".rope", "theta"), p);
  }
}

void dense_ffn(const Cfg& c, const json& b, const std::string& p, Agree& a) {
  const json* sh = c.opt(b, "shared_experts");
  OLMO_CHECK(sh, c.ctx, ": ", p, " has neither routed_experts nor shared_experts (no feed-forward)");
  a.set("dense_mlp_intermediate_size", c.integer(*sh, p + ".shared_experts", "hidden_size"), p);
  c.must_be_null(b, p, "latent_moe", "a dense layer has no latent projections");
}

void routed_ffn(const Cfg& c, const json& b, const std::string& p, int64_t d, Agree& a) {
  const std::string rp = p + ".routed_experts_router", ep = p + ".routed_experts";
  const json& r = c.get(b, p, "routed_experts_router");
  const json& ex = c.get(b, p, "routed_experts");
  c.must_be_null(r, rp, "bias", "the HF router is bias-free");
  for (const char* k : {"uniform_expert_assignment", "random_expert_assignment", "score_correction_bias",
                        "bias_gamma", "n_group", "topk_group", "expert_weight_scale", "emo"})
    c.must_be_null(r, rp, k, "a routing modifier the HF olmo3moe router does not compute");
  OLMO_CHECK(c.integer(r, rp, "d_model") == d, c.ctx, ": ", rp, ".d_model must equal model.d_model ", d);
  const int64_t experts = c.integer(ex, ep, "num_experts");
  OLMO_CHECK(c.integer(r, rp, "num_experts") == experts, c.ctx, ": ", rp, ".num_experts differs from ", ep,
             ".num_experts");
  c.must_be_null(ex, ep, "bias", "the HF experts are bias-free");
  if (c.opt(ex, "activation")) c.must_be(ex, ep, "activation", "swiglu", "the HF experts are SwiGLU");
  a.set("n_routed_experts", experts, p);
  a.set("moe_intermediate_size", c.integer(ex, ep, "hidden_size"), p);
  a.set("num_experts_per_tok", c.integer(r, rp, "top_k"), p);
  a.set("original_num_experts_per_tok",
        c.opt(r, "original_top_k") ? json(c.integer(r, rp, "original_top_k")) : json(), p);
  const json* gf = c.opt(r, "gating_function");
  OLMO_CHECK(!gf || *gf == "softmax" || *gf == "sigmoid", c.ctx, ": ", rp, ".gating_function is ", gf->dump(),
             ", only softmax or sigmoid is supported");
  a.set("gating_function", gf ? *gf : json("softmax"), p);
  const json* nw = c.opt(r, "normalize_expert_weights");
  OLMO_CHECK(!nw || nw->is_number(), c.ctx, ": ", rp, ".normalize_expert_weights must be a number");
  a.set("normalize_expert_weights", nw ? *nw : json(), p);
  a.set("restore_weight_scale", c.boolean(r, rp, "restore_weight_scale", false), p);
  c.must_be_null(b, p, "shared_experts_router", "the HF model has one shared expert with weight 1");
  int64_t routed_d = d;
  if (const json* lat = c.opt(b, "latent_moe")) {
    c.must_be_null(*lat, p + ".latent_moe", "bias", "latent projection biases are not in olmosft's registry");
    c.must_be_null(*lat, p + ".latent_moe", "up_proj_input_norm_enabled",
                   "the latent up-projection input norm is not in olmosft's registry");
    routed_d = c.integer(*lat, p + ".latent_moe", "latent_dim");
    a.set("latent_moe_dim", routed_d, p);
  } else {
    a.set("latent_moe_dim", nullptr, p);
  }
  OLMO_CHECK(c.integer(ex, ep, "d_model") == routed_d, c.ctx, ": ", ep, ".d_model must be ", routed_d,
             " (the latent dim, or d_model without latent_moe)");
  const json* sh = c.opt(b, "shared_experts");
  a.set("shared_expert_intermediate_size",
        sh ? json(c.integer(*sh, p + ".shared_experts", "hidden_size")) : json(), p);
}

// Block-level checks shared by every layer; returns the block norms' eps.
double block_common(const Cfg& c, const json& b, const std::string& p, int64_t d, Agree& a) {
  c.must_be(b, p, "name", "moe_fused_v2", "one block type: OLMoDDPTransformerBlockConfig");
  c.must_be_null(b, p, "feed_forward", "OLMoDDP blocks use shared_experts / routed_experts");
  c.must_be_null(b, p, "feed_forward_moe", "OLMoDDP blocks use shared_experts / routed_experts");
  c.must_be_null(b, p, "use_pre_norm", "OLMo-core's HF export requires post (and peri) norms");
  for (const char* k : {"attention_residual_alpha", "feed_forward_residual_alpha", "dropout"})
    c.must_be_null(b, p, k, "not in the HF model");
  a.set("use_peri_ln", c.boolean(b, p, "use_peri_norm", false), p);
  for (const char* k : {"shared_experts"}) {
    if (const json* sh = c.opt(b, k)) {
      const std::string sp = p + "." + k;
      OLMO_CHECK(c.integer(*sh, sp, "num_experts") == 1, c.ctx, ": ", sp, ".num_experts must be 1");
      OLMO_CHECK(c.integer(*sh, sp, "d_model") == d, c.ctx, ": ", sp, ".d_model must equal model.d_model ",
                 d);
      c.must_be_null(*sh, sp, "bias", "the HF shared expert is bias-free");
      if (c.opt(*sh, "activation")) c.must_be(*sh, sp, "activation", "swiglu", "the HF MLPs are SwiGLU");
    }
  }
  return rms_eps(c, c.get(b, p, "layer_norm"), p + ".layer_norm");
}

}  // namespace

json hybrid_hf_config(const Cfg& c, const json& m) {
  json hf = json::object();
  hf["model_type"] = "olmo3moe";
  hf["architectures"] = {"Olmo3MoeForCausalLM"};
  const int64_t d = c.integer(m, "model", "d_model"), n_layers = c.integer(m, "model", "n_layers");
  hf["vocab_size"] = c.integer(m, "model", "vocab_size");
  hf["hidden_size"] = d;
  hf["num_hidden_layers"] = n_layers;
  hf["hidden_act"] = "silu";
  hf["attention_bias"] = false;
  hf["dense_layers_use_shared_expert"] = true;
  Agree a{c, hf};
  json types = json::array(), dense = json::array();
  const std::vector<Layer> layers = resolve_layers(c, m, n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    const Layer& L = layers[size_t(l)];
    const json& b = *L.block;
    const double eps = block_common(c, b, L.path, d, a);
    a.set("rms_norm_eps", eps, L.path + ".layer_norm");
    const std::string mp = L.path + ".sequence_mixer";
    const json& mx = c.get(b, L.path, "sequence_mixer");
    const json* type = c.opt(mx, "type");
    if (type && *type == "kimi_delta_attention") {
      kda_layer(c, mx, mp, d, a);
      types.push_back("linear_attention");
    } else {
      OLMO_CHECK(type && *type == "attention", c.ctx, ": ", mp, ".type is ", type ? type->dump() : "missing",
                 "; the hybrid maps \"attention\" and \"kimi_delta_attention\" (OLMo-core's KDA)");
      attention_layer(c, mx, mp, eps, a);
      types.push_back("full_attention");
    }
    if (c.opt(b, "routed_experts")) {
      routed_ffn(c, b, L.path, d, a);
    } else {
      dense_ffn(c, b, L.path, a);
      dense.push_back(l);
    }
  }
  OLMO_CHECK(hf.contains("num_attention_heads"), c.ctx,
             ": no softmax-attention layer (the HF olmo3moe config needs its attention shape)");
  OLMO_CHECK(hf.contains("n_routed_experts"), c.ctx,
             ": no routed-expert (MoE) layer; a dense model is not olmo3moe");
  hf["layer_types"] = types;
  hf["dense_layers_indices"] = dense;
  const double eps = hf["rms_norm_eps"].get<double>();
  const json& lm = c.get(m, "model", "lm_head");
  c.must_be_null(lm, "model.lm_head", "bias", "the HF lm_head has no bias");
  OLMO_CHECK(rms_eps(c, c.get(lm, "model.lm_head", "layer_norm"), "model.lm_head.layer_norm") == eps, c.ctx,
             ": model.lm_head.layer_norm.eps differs from the block norms' eps");
  if (const json* en = c.opt(m, "embedding_norm"))
    OLMO_CHECK(rms_eps(c, *en, "model.embedding_norm") == eps, c.ctx,
               ": model.embedding_norm.eps differs from the block norms' eps");
  hf["embed_norm"] = c.opt(m, "embedding_norm") != nullptr;
  hf["embed_scale"] = c.opt(m, "embed_scale") ? c.number(m, "model", "embed_scale") : 1.0;
  hf["tie_word_embeddings"] = c.boolean(m, "model", "tie_word_embeddings", false);
  return hf;
}

}  // namespace olmosft::model::olmo_core
