#include "model/params.h"

namespace olmosft::model {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct Builder {
  std::vector<ParamSpec> out;
  void add(std::string name, Shape shape, int64_t layer = -1, bool routed = false, bool fp32 = false) {
    const bool decay = shape.size() >= 2 && !ends_with(name, "norm.weight");
    out.push_back({std::move(name), std::move(shape), layer, routed, fp32, decay});
  }
};

void olmo3_layer(Builder& b, const ModelConfig& c, int64_t i) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  int64_t d = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  int64_t f = c.intermediate_size;
  b.add(p + "self_attn.q_proj.weight", {q, d}, i);
  b.add(p + "self_attn.k_proj.weight", {kv, d}, i);
  b.add(p + "self_attn.v_proj.weight", {kv, d}, i);
  b.add(p + "self_attn.o_proj.weight", {d, q}, i);
  b.add(p + "self_attn.q_norm.weight", {q}, i);
  b.add(p + "self_attn.k_norm.weight", {kv}, i);
  b.add(p + "mlp.gate_proj.weight", {f, d}, i);
  b.add(p + "mlp.up_proj.weight", {f, d}, i);
  b.add(p + "mlp.down_proj.weight", {d, f}, i);
  b.add(p + "post_attention_layernorm.weight", {d}, i);
  b.add(p + "post_feedforward_layernorm.weight", {d}, i);
}

void moe_layer(Builder& b, const ModelConfig& c, int64_t i) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const std::string a = p + "self_attn.";
  int64_t d = c.hidden_size;
  // Peri-LN: four block norms.
  b.add(p + "pre_attention_layernorm.weight", {d}, i);
  b.add(p + "post_attention_layernorm.weight", {d}, i);
  b.add(p + "pre_feedforward_layernorm.weight", {d}, i);
  b.add(p + "post_feedforward_layernorm.weight", {d}, i);
  if (c.layer_types[static_cast<size_t>(i)] == LayerType::LinearAttention) {
    int64_t H = c.linear_num_key_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
    int64_t K = c.linear_conv_kernel_dim, kd = H * dk, vd = H * dv;
    b.add(a + "q_proj.weight", {kd, d}, i);
    b.add(a + "k_proj.weight", {kd, d}, i);
    b.add(a + "v_proj.weight", {vd, d}, i);
    b.add(a + "f_proj_1.weight", {dv, d}, i);
    b.add(a + "f_proj_2.weight", {kd, dv}, i);
    b.add(a + "beta_proj.weight", {H, d}, i);
    b.add(a + "A_log", {H}, i, false, true);
    b.add(a + "dt_bias", {kd}, i, false, true);
    b.add(a + "q_conv1d.weight", {kd, 1, K}, i);
    b.add(a + "k_conv1d.weight", {kd, 1, K}, i);
    b.add(a + "v_conv1d.weight", {vd, 1, K}, i);
    b.add(a + "g_proj_1.weight", {dv, d}, i);
    b.add(a + "g_proj_2.weight", {vd, dv}, i);
    b.add(a + "g_proj_2.bias", {vd}, i);
    b.add(a + "o_norm.weight", {dv}, i);
    b.add(a + "o_proj.weight", {d, vd}, i);
  } else {
    int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    b.add(a + "q_proj.weight", {H * D, d}, i);
    b.add(a + "k_proj.weight", {Hkv * D, d}, i);
    b.add(a + "v_proj.weight", {Hkv * D, d}, i);
    b.add(a + "o_proj.weight", {d, H * D}, i);
    if (c.qk_norm_per_head_gains) {
      b.add(a + "q_norm.weight", {H, D}, i);
      b.add(a + "k_norm.weight", {Hkv, D}, i);
    } else {
      b.add(a + "q_norm.weight", {H * D}, i);
      b.add(a + "k_norm.weight", {Hkv * D}, i);
    }
    if (c.attention_gate_type == "elementwise") b.add(a + "g_proj.weight", {H * D, d}, i);
    if (c.scalable_softmax) b.add(a + "ssmax_scale", {H}, i);
  }
  const std::string m = p + "mlp.";
  if (c.is_dense_layer(i)) {
    int64_t f = c.dense_mlp_intermediate_size;
    b.add(m + "gate_proj.weight", {f, d}, i);
    b.add(m + "up_proj.weight", {f, d}, i);
    b.add(m + "down_proj.weight", {d, f}, i);
    return;
  }
  int64_t E = c.n_routed_experts, h = c.moe_intermediate_size;
  int64_t in = c.latent_moe_dim > 0 ? c.latent_moe_dim : d;  // width the experts run in
  b.add(m + "router.gate.weight", {E, d}, i);
  if (c.latent_moe_dim > 0) {
    b.add(m + "latent_down_proj.weight", {c.latent_moe_dim, d}, i);
    b.add(m + "latent_up_proj.weight", {d, c.latent_moe_dim}, i);
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = m + "experts." + std::to_string(e) + ".";
    b.add(x + "gate_proj.weight", {h, in}, i, true);
    b.add(x + "up_proj.weight", {h, in}, i, true);
    b.add(x + "down_proj.weight", {in, h}, i, true);
  }
  if (c.shared_expert_intermediate_size > 0) {
    int64_t s = c.shared_expert_intermediate_size;
    b.add(m + "shared_expert.gate_proj.weight", {s, d}, i);
    b.add(m + "shared_expert.up_proj.weight", {s, d}, i);
    b.add(m + "shared_expert.down_proj.weight", {d, s}, i);
  }
}

}  // namespace

std::vector<ParamSpec> param_registry(const ModelConfig& c) {
  Builder b;
  int64_t V = c.vocab_size, d = c.hidden_size;
  b.add("model.embed_tokens.weight", {V, d});
  if (c.is_moe() && c.embed_norm) b.add("model.embed_norm.weight", {d});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_moe())
      moe_layer(b, c, i);
    else
      olmo3_layer(b, c, i);
  }
  b.add("model.norm.weight", {d});
  if (!c.tie_word_embeddings) b.add("lm_head.weight", {V, d});
  return std::move(b.out);
}

ParamCounts count_params(const ModelConfig& c, const std::vector<ParamSpec>& reg) {
  ParamCounts pc;
  int64_t routed = 0;
  for (const auto& p : reg) {
    int64_t n = shape_numel(p.shape);
    pc.total += n;
    if (p.routed_expert) routed += n;
  }
  pc.tensors = reg.size();
  pc.active = pc.total - routed;
  if (c.is_moe() && routed > 0) pc.active += routed / c.n_routed_experts * c.num_experts_per_tok;
  return pc;
}

ParamCounts count_params(const ModelConfig& c) { return count_params(c, param_registry(c)); }

}  // namespace olmosft::model
