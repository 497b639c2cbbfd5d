#include "model/params.h"

namespace olmosft::model {

std::string hf::layer(int64_t l) { return std::string(kLayersPrefix) + std::to_string(l) + "."; }

int64_t hf::layer_of(const std::string& name) {
  const std::string pre = kLayersPrefix;
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  int64_t l = 0;
  size_t i = pre.size();
  for (; i < name.size() && i < pre.size() + 12 && name[i] >= '0' && name[i] <= '9'; ++i)
    l = l * 10 + (name[i] - '0');
  return i > pre.size() && i < name.size() && name[i] == '.' ? l : -1;
}
std::string hf::expert(int64_t e) { return "experts." + std::to_string(e) + "."; }
std::string hf::shared_expert(const char* proj) { return std::string("shared_expert.") + proj; }
const char* hf::mixer_prefix(MixerKind m) { return m == MixerKind::Gdn ? kLinearAttn : kSelfAttn; }

hf::BlockNorms hf::block_norms(const LayerSpec& s) {
  if (s.pre_norm && !s.post_norm) return {kInputNorm, nullptr, kPostAttnNorm, nullptr};
  if (s.pre_norm) return {kPreAttnNorm, kPostAttnNorm, kPreFfnNorm, kPostFfnNorm};
  return {nullptr, kPostAttnNorm, nullptr, kPostFfnNorm};
}

std::optional<hf::ImportAlias> hf::import_alias(const ModelConfig& c, const std::string& stored) {
  if (c.model_type != ModelType::OlmoHybrid) return std::nullopt;
  const int64_t l = layer_of(stored);
  if (l < 0) return std::nullopt;
  const std::string p = layer(l), rest = stored.substr(p.size());
  const std::string la = kLinearAttn;
  if (rest == "attention_layer_norm.weight") return ImportAlias{p + kInputNorm};
  if (rest == "feedforward_layer_norm.weight") return ImportAlias{p + kPostAttnNorm};
  if (rest == la + "out_proj.weight") return ImportAlias{p + la + kOProj};
  if (rest == la + "norm.weight") return ImportAlias{p + la + kONorm};
  const char* convs[3] = {kQConv, kKConv, kVConv};
  for (int i = 0; i < 3; ++i)
    if (rest == la + convs[i]) return ImportAlias{p + la + kConv1d, i, 3};
  return std::nullopt;
}

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
  const std::string p = hf::layer(i);
  int64_t d = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  int64_t f = c.intermediate_size;
  b.add(p + hf::kSelfAttn + hf::kQProj, {q, d}, i);
  b.add(p + hf::kSelfAttn + hf::kKProj, {kv, d}, i);
  b.add(p + hf::kSelfAttn + hf::kVProj, {kv, d}, i);
  b.add(p + hf::kSelfAttn + hf::kOProj, {d, q}, i);
  b.add(p + hf::kSelfAttn + hf::kQNorm, {q}, i);
  b.add(p + hf::kSelfAttn + hf::kKNorm, {kv}, i);
  b.add(p + hf::kMlp + hf::kGateProj, {f, d}, i);
  b.add(p + hf::kMlp + hf::kUpProj, {f, d}, i);
  b.add(p + hf::kMlp + hf::kDownProj, {d, f}, i);
  b.add(p + hf::kPostAttnNorm, {d}, i);
  b.add(p + hf::kPostFfnNorm, {d}, i);
}

// olmo_hybrid's linear_attention layer (HF state-dict order): the SwiGLU, the pre-norms, then the GDN mixer.
void gdn_layer(Builder& b, const ModelConfig& c, int64_t i) {
  const std::string p = hf::layer(i), a = p + hf::kLinearAttn, m = p + hf::kMlp;
  const int64_t d = c.hidden_size, f = c.intermediate_size, H = c.linear_num_value_heads;  // per value head
  const int64_t kd = c.linear_num_key_heads * c.linear_key_head_dim, vd = H * c.linear_value_head_dim,
                K = c.linear_conv_kernel_dim;
  b.add(m + hf::kGateProj, {f, d}, i);
  b.add(m + hf::kUpProj, {f, d}, i);
  b.add(m + hf::kDownProj, {d, f}, i);
  b.add(p + hf::kInputNorm, {d}, i);
  b.add(p + hf::kPostAttnNorm, {d}, i);
  b.add(a + hf::kALog, {H}, i, false, true);
  b.add(a + hf::kDtBias, {H}, i, false, true);
  b.add(a + hf::kQProj, {kd, d}, i);
  b.add(a + hf::kKProj, {kd, d}, i);
  b.add(a + hf::kVProj, {vd, d}, i);
  b.add(a + hf::kAProj, {H, d}, i);
  b.add(a + hf::kBProj, {H, d}, i);
  b.add(a + hf::kGProj, {vd, d}, i);
  b.add(a + hf::kOProj, {d, vd}, i);
  b.add(a + hf::kConv1d, {2 * kd + vd, 1, K}, i);
  b.add(a + hf::kONorm, {c.linear_value_head_dim}, i);
}

void moe_layer(Builder& b, const ModelConfig& c, int64_t i) {
  const std::string p = hf::layer(i);
  const std::string a = p + hf::kSelfAttn;
  int64_t d = c.hidden_size;
  // Peri-LN: four block norms.
  b.add(p + hf::kPreAttnNorm, {d}, i);
  b.add(p + hf::kPostAttnNorm, {d}, i);
  b.add(p + hf::kPreFfnNorm, {d}, i);
  b.add(p + hf::kPostFfnNorm, {d}, i);
  if (c.layer_types[static_cast<size_t>(i)] == LayerType::LinearAttention) {
    int64_t H = c.linear_num_key_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
    int64_t K = c.linear_conv_kernel_dim, kd = H * dk, vd = H * dv;
    b.add(a + hf::kQProj, {kd, d}, i);
    b.add(a + hf::kKProj, {kd, d}, i);
    b.add(a + hf::kVProj, {vd, d}, i);
    b.add(a + hf::kFProj1, {dv, d}, i);
    b.add(a + hf::kFProj2, {kd, dv}, i);
    b.add(a + hf::kBetaProj, {H, d}, i);
    b.add(a + hf::kALog, {H}, i, false, true);
    b.add(a + hf::kDtBias, {kd}, i, false, true);
    b.add(a + hf::kQConv, {kd, 1, K}, i);
    b.add(a + hf::kKConv, {kd, 1, K}, i);
    b.add(a + hf::kVConv, {vd, 1, K}, i);
    b.add(a + hf::kGProj1, {dv, d}, i);
    b.add(a + hf::kGProj2, {vd, dv}, i);
    b.add(a + hf::kGProj2Bias, {vd}, i);
    b.add(a + hf::kONorm, {dv}, i);
    b.add(a + hf::kOProj, {d, vd}, i);
  } else {
    int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
    b.add(a + hf::kQProj, {H * D, d}, i);
    b.add(a + hf::kKProj, {Hkv * D, d}, i);
    b.add(a + hf::kVProj, {Hkv * D, d}, i);
    b.add(a + hf::kOProj, {d, H * D}, i);
    if (c.qk_norm_per_head_gains) {
      b.add(a + hf::kQNorm, {H, D}, i);
      b.add(a + hf::kKNorm, {Hkv, D}, i);
    } else {
      b.add(a + hf::kQNorm, {H * D}, i);
      b.add(a + hf::kKNorm, {Hkv * D}, i);
    }
    if (c.attention_gate_type == "elementwise") b.add(a + hf::kGProj, {H * D, d}, i);
    if (c.scalable_softmax) b.add(a + hf::kSsmaxScale, {H}, i);
  }
  const std::string m = p + hf::kMlp;
  if (c.is_dense_layer(i)) {
    int64_t f = c.dense_mlp_intermediate_size;
    b.add(m + hf::kGateProj, {f, d}, i);
    b.add(m + hf::kUpProj, {f, d}, i);
    b.add(m + hf::kDownProj, {d, f}, i);
    return;
  }
  int64_t E = c.n_routed_experts, h = c.moe_intermediate_size;
  int64_t in = c.latent_moe_dim > 0 ? c.latent_moe_dim : d;  // width the experts run in
  b.add(m + hf::kRouter, {E, d}, i);
  if (c.latent_moe_dim > 0) {
    b.add(m + hf::kLatentDown, {c.latent_moe_dim, d}, i);
    b.add(m + hf::kLatentUp, {d, c.latent_moe_dim}, i);
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = m + hf::expert(e);
    b.add(x + hf::kGateProj, {h, in}, i, true);
    b.add(x + hf::kUpProj, {h, in}, i, true);
    b.add(x + hf::kDownProj, {in, h}, i, true);
  }
  if (c.shared_expert_intermediate_size > 0) {
    int64_t s = c.shared_expert_intermediate_size;
    b.add(m + hf::shared_expert(hf::kGateProj), {s, d}, i);
    b.add(m + hf::shared_expert(hf::kUpProj), {s, d}, i);
    b.add(m + hf::shared_expert(hf::kDownProj), {d, s}, i);
  }
}

}  // namespace

std::vector<ParamSpec> param_registry(const ModelConfig& c) {
  Builder b;
  int64_t V = c.vocab_size, d = c.hidden_size;
  b.add(hf::kEmbedTokens, {V, d});
  if (c.is_moe() && c.embed_norm) b.add(hf::kEmbedNorm, {d});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_moe())
      moe_layer(b, c, i);
    else if (c.model_type == ModelType::OlmoHybrid &&
             c.layer_types[static_cast<size_t>(i)] == LayerType::LinearAttention)
      gdn_layer(b, c, i);
    else
      olmo3_layer(b, c, i);  // Olmo 3's layers and olmo_hybrid's full_attention layers
  }
  b.add(hf::kFinalNorm, {d});
  if (!c.tie_word_embeddings) b.add(hf::kLmHead, {V, d});
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
