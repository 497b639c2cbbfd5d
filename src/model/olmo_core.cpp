#include "model/olmo_core.h"

#include <filesystem>
#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json.h"
#include "model/olmo_core_cfg.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace olmosft::model::olmo_core {

namespace {

constexpr const char* kModelPrefix = "model.";  // OLMo-core's checkpoint keys: "model.<parameter name>"

// Layer types from OLMo-core's SlidingWindowAttentionConfig: pattern repeated over the layers (-1 =
// full attention), optionally forcing full attention on the first / last layer. OLMo-core's window w
// covers the current token and the w - 1 before it (flash-attn window (w - 1, 0)), which is HF's
// sliding_window = w (olmo_core/nn/hf/config.py writes window_size[0] + 1).
void sliding_layers(const Cfg& c, const json& sw, int64_t n_layers, json& out) {
  const std::string path = "model.block.attention.sliding_window";
  const json& pat = c.get(sw, path, "pattern");
  OLMO_CHECK(pat.is_array() && !pat.empty(), c.ctx, ": ", path, ".pattern must be a non-empty list");
  int64_t window = 0;
  std::vector<int64_t> w;
  for (const auto& x : pat) {
    OLMO_CHECK(x.is_number_integer() && (x.get<int64_t>() == -1 || x.get<int64_t>() > 0), c.ctx, ": ", path,
               ".pattern holds ", x.dump(), " (expected window sizes > 0 or -1)");
    w.push_back(x.get<int64_t>());
    if (w.back() > 0) {
      OLMO_CHECK(window == 0 || window == w.back(), c.ctx, ": ", path, ".pattern mixes window sizes ", window,
                 " and ", w.back(), " (the HF config has one sliding_window)");
      window = w.back();
    }
  }
  // OLMo-core's defaults: both flags true; with the first layer forced full, the pattern starts at layer 1.
  auto flag = [&](const char* k) {
    const json* v = c.opt(sw, k);
    OLMO_CHECK(!v || v->is_boolean(), c.ctx, ": ", path, ".", k, " must be true or false");
    return !v || v->get<bool>();
  };
  const bool first = flag("force_full_attention_on_first_layer"),
             last = flag("force_full_attention_on_last_layer");
  const int64_t n = int64_t(w.size());
  json types = json::array();
  for (int64_t l = 0; l < n_layers; ++l) {
    const int64_t eff = l - (first ? 1 : 0);
    bool full = w[size_t(((eff % n) + n) % n)] < 0;
    if ((l == 0 && first) || (l == n_layers - 1 && last)) full = true;
    types.push_back(full ? "full_attention" : "sliding_attention");
  }
  out["layer_types"] = types;
  if (window > 0) out["sliding_window"] = window;
}

const json& model_of(const json& j, const std::string& ctx) {
  OLMO_CHECK(j.is_object(), ctx, ": expected a JSON object");
  if (j.contains("model") && j["model"].is_object()) return j["model"];
  OLMO_CHECK(j.contains("d_model"), ctx,
             ": neither a 'model' object (an OLMo-core experiment config) nor a "
             "TransformerConfig (with 'd_model')");
  return j;
}

}  // namespace

namespace {

// Olmo 3 dense (TransformerType "default", reordered-norm blocks) as an HF olmo3 config.
json dense_hf_config(const Cfg& c, const json& m) {
  const std::string& ctx = c.ctx;
  c.must_be(m, "model", "name", "default",
            "the plain transformer, or \"moe_fused_v2\" (the Olmo 3.5 hybrid); the other MoE and normalized "
            "models are not mapped");
  const json& block = c.get(m, "model", "block");
  OLMO_CHECK(block.is_object() && (block.contains("attention") || block.contains("sequence_mixer")), ctx,
             ": model.block must be one block config (per-layer block dicts are not supported)");
  c.must_be_null(m, "model", "block_overrides", "per-layer overrides");
  c.must_be_null(m, "model", "block_pattern", "mixed block types");
  c.must_be_null(m, "model", "embedding_norm", "Olmo 3 has no embedding norm");
  c.must_be_null(m, "model", "embed_scale", "Olmo 3 does not scale embeddings");
  c.must_be(block, "model.block", "name", "reordered_norm", "Olmo 2/3 norm placement");
  // OLMo-core 3.0 writes the attention config as block.sequence_mixer (type "attention"); older versions
  // as block.attention.
  const bool mixer = block.contains("sequence_mixer");
  const std::string ap = mixer ? "model.block.sequence_mixer" : "model.block.attention";
  const json& att = c.get(block, "model.block", mixer ? "sequence_mixer" : "attention");
  if (mixer)
    c.must_be(att, ap, "type", "attention", "softmax attention; linear-attention mixers are not mapped");
  c.must_be(att, ap, "name", "default", "separate q/k/v projections");
  c.must_be_null(att, ap, "attention_sinks", "not in the HF model");
  c.must_be_null(att, ap, "scalable_softmax", "not in Olmo 3");
  c.must_be_null(att, ap, "bias", "Olmo 3 has no biases");
  c.must_be_null(att, ap, "clip_qkv", "not in the HF model");
  c.must_be_null(att, ap, "use_head_qk_norm", "per-head q/k norms are not in Olmo 3");
  c.must_be_null(att, ap, "gate", "gated attention is not in Olmo 3");
  const json& ln = c.get(block, "model.block", "layer_norm");
  c.must_be(ln, "model.block.layer_norm", "name", "rms", "RMSNorm");
  c.must_be_null(ln, "model.block.layer_norm", "bias", "Olmo 3 norms have no bias");
  const double eps = c.number(ln, "model.block.layer_norm", "eps");
  const json* qk = c.opt(att, "qk_norm");
  OLMO_CHECK(qk, ctx, ": ", ap, ".qk_norm is missing (Olmo 3 normalises q and k)");
  c.must_be(*qk, ap + ".qk_norm", "name", "rms", "RMSNorm");
  OLMO_CHECK(c.number(*qk, ap + ".qk_norm", "eps") == eps, ctx, ": ", ap,
             ".qk_norm.eps differs from model.block.layer_norm.eps (the HF config has one rms_norm_eps)");
  const json& ff = c.get(block, "model.block", "feed_forward");
  c.must_be_null(ff, "model.block.feed_forward", "bias", "Olmo 3 has no biases");
  const json* ffname = c.opt(ff, "name");
  OLMO_CHECK(!ffname || *ffname == "default", ctx, ": model.block.feed_forward.name is ", ffname->dump(),
             ", only the SwiGLU feed-forward (\"default\") is supported");
  OLMO_CHECK(!c.opt(block, "feed_forward_moe"), ctx,
             ": model.block.feed_forward_moe is set (MoE blocks are not "
             "mapped by this import)");
  const json& lm = c.get(m, "model", "lm_head");
  c.must_be_null(lm, "model.lm_head", "bias", "Olmo 3 has no biases");
  if (const json* lml = c.opt(lm, "layer_norm"))
    OLMO_CHECK(c.number(*lml, "model.lm_head.layer_norm", "eps") == eps, ctx,
               ": model.lm_head.layer_norm.eps differs from model.block.layer_norm.eps");
  json hf = json::object();
  hf["model_type"] = "olmo3";
  hf["architectures"] = {"Olmo3ForCausalLM"};
  hf["vocab_size"] = c.integer(m, "model", "vocab_size");
  hf["hidden_size"] = c.integer(m, "model", "d_model");
  hf["num_hidden_layers"] = c.integer(m, "model", "n_layers");
  hf["num_attention_heads"] = c.integer(att, ap, "n_heads");
  hf["num_key_value_heads"] =
      c.opt(att, "n_kv_heads") ? c.integer(att, ap, "n_kv_heads") : hf["num_attention_heads"].get<int64_t>();
  if (c.opt(att, "head_dim")) hf["head_dim"] = c.integer(att, ap, "head_dim");
  hf["intermediate_size"] = c.integer(ff, "model.block.feed_forward", "hidden_size");
  hf["rms_norm_eps"] = eps;
  hf["hidden_act"] = "silu";
  hf["attention_bias"] = false;
  if (const json* tie = c.opt(m, "tie_word_embeddings")) {
    OLMO_CHECK(tie->is_boolean(), ctx, ": model.tie_word_embeddings must be true or false, got ",
               tie->dump());
    hf["tie_word_embeddings"] = tie->get<bool>();
  } else {
    hf["tie_word_embeddings"] = false;
  }
  const json* rope = c.opt(att, "rope");
  OLMO_CHECK(rope, ctx, ": ", ap, ".rope is missing (Olmo 3 uses RoPE)");
  c.must_be(*rope, ap + ".rope", "name", "default", "standard RoPE");
  c.must_be_null(*rope, ap + ".rope", "scaling", "RoPE scaling is not mapped yet");
  c.must_be_null(*rope, ap + ".rope", "no_global_rope", "RoPE on every layer");
  if (const json* prf = c.opt(*rope, "partial_rotary_factor"))
    OLMO_CHECK(prf->is_number() && prf->get<double>() == 1.0, ctx, ": ", ap,
               ".rope.partial_rotary_factor is ", prf->dump(),
               ", only 1.0 is supported (Olmo 3 rotates every dim)");
  hf["rope_theta"] = c.number(*rope, ap + ".rope", "theta");
  int64_t layers = hf["num_hidden_layers"].get<int64_t>();
  if (const json* sw = c.opt(att, "sliding_window")) {
    sliding_layers(c, *sw, layers, hf);
  } else {
    hf["layer_types"] = json(std::vector<std::string>(size_t(layers), "full_attention"));
  }
  return hf;
}

}  // namespace

json hf_config_json(const json& root, const std::string& ctx) {
  Cfg c{ctx};
  const json& m = model_of(root, ctx);
  const json* name = c.opt(m, "name");
  json hf = name && *name == "moe_fused_v2" ? hybrid_hf_config(c, m) : dense_hf_config(c, m);
  if (const json* dt = c.opt(m, "dtype"); dt && dt->is_string() && (*dt == "bfloat16" || *dt == "float32"))
    hf["torch_dtype"] = *dt;
  // Token ids: the model config has none; an experiment config has them in dataset.tokenizer.
  const json* tok = root.contains("dataset") ? c.opt(root["dataset"], "tokenizer") : c.opt(root, "tokenizer");
  if (tok && tok->is_object()) {
    for (const char* k : {"eos_token_id", "pad_token_id", "bos_token_id"}) {
      if (const json* v = c.opt(*tok, k)) hf[k] = *v;  // checked against the vocabulary by parse_config
    }
  }
  return hf;
}

ModelConfig load_config(const std::string& path) {
  std::string text = io::read_file(path);
  json j = io::parse_json(text, path);
  return parse_config(hf_config_json(j, path), path + " (mapped from OLMo-core)");
}

namespace {

// Per-layer (OLMo-core suffix under "blocks.<l>.", HF suffix under "model.layers.<l>.") of the whole tensors.
using Pairs = std::vector<std::pair<std::string, std::string>>;
const Pairs& dense_pairs() {
  static const Pairs p = {{"attention.w_q.weight", std::string(hf::kSelfAttn) + hf::kQProj},
                          {"attention.w_k.weight", std::string(hf::kSelfAttn) + hf::kKProj},
                          {"attention.w_v.weight", std::string(hf::kSelfAttn) + hf::kVProj},
                          {"attention.w_out.weight", std::string(hf::kSelfAttn) + hf::kOProj},
                          {"attention.q_norm.weight", std::string(hf::kSelfAttn) + hf::kQNorm},
                          {"attention.k_norm.weight", std::string(hf::kSelfAttn) + hf::kKNorm},
                          {"feed_forward.w1.weight", std::string(hf::kMlp) + hf::kGateProj},
                          {"feed_forward.w2.weight", std::string(hf::kMlp) + hf::kDownProj},
                          {"feed_forward.w3.weight", std::string(hf::kMlp) + hf::kUpProj},
                          {"attention_norm.weight", hf::kPostAttnNorm},
                          {"feed_forward_norm.weight", hf::kPostFfnNorm}};
  return p;
}
// The hybrid (OLMoDDPTransformerBlock): KDA and softmax attention share attention.w_q/w_k/w_v/w_out.
const Pairs& hybrid_pairs() {
  static const Pairs p = [] {
    const std::string a = "attention.", sa = hf::kSelfAttn, m = hf::kMlp;
    Pairs v = {{a + "w_q.weight", sa + hf::kQProj},
               {a + "w_k.weight", sa + hf::kKProj},
               {a + "w_v.weight", sa + hf::kVProj},
               {a + "w_out.weight", sa + hf::kOProj},
               {a + "q_norm.weight", sa + hf::kQNorm},
               {a + "k_norm.weight", sa + hf::kKNorm},
               {a + "w_g.weight", sa + hf::kGProj},
               {a + "ssmax_scale", sa + hf::kSsmaxScale},
               {a + "f_proj_1.weight", sa + hf::kFProj1},
               {a + "f_proj_2.weight", sa + hf::kFProj2},
               {a + "w_b.weight", sa + hf::kBetaProj},
               {a + "A_log", sa + hf::kALog},
               {a + "dt_bias", sa + hf::kDtBias},
               {a + "q_conv1d.weight", sa + hf::kQConv},
               {a + "k_conv1d.weight", sa + hf::kKConv},
               {a + "v_conv1d.weight", sa + hf::kVConv},
               {a + "g_proj_1.weight", sa + hf::kGProj1},
               {a + "g_proj_2.weight", sa + hf::kGProj2},
               {a + "g_proj_2.bias", sa + hf::kGProj2Bias},
               {a + "o_norm.weight", sa + hf::kONorm},
               {"attention_norm.weight", hf::kPostAttnNorm},
               {"feed_forward_norm.weight", hf::kPostFfnNorm},
               {"attention_input_norm.weight", hf::kPreAttnNorm},
               {"feed_forward_input_norm.weight", hf::kPreFfnNorm},
               {"routed_experts_router.weight", m + hf::kRouter},
               {"latent_down_proj.weight", m + hf::kLatentDown},
               {"latent_up_proj.weight", m + hf::kLatentUp}};
    return v;
  }();
  return p;
}

// "blocks.<l>." + rest -> l (canonical decimal, at most 9 digits); -1 otherwise.
int64_t block_of(const std::string& n, std::string* rest) {
  const std::string pre = "blocks.";
  if (n.compare(0, pre.size(), pre) != 0) return -1;
  size_t dot = n.find('.', pre.size());
  if (dot == std::string::npos || dot == pre.size() || dot - pre.size() > 9) return -1;
  const std::string num = n.substr(pre.size(), dot - pre.size());
  if (num.find_first_not_of("0123456789") != std::string::npos || (num.size() > 1 && num[0] == '0'))
    return -1;
  *rest = n.substr(dot + 1);
  return std::stoll(num);
}

// The routed/shared/dense SwiGLU pieces of a hybrid layer's "mlp." tensor (HF suffix after "mlp.").
Source hybrid_mlp_source(const std::string& blk, const std::string& mlp, const ParamSpec& p,
                         const ModelConfig& c) {
  const int64_t d = c.hidden_size;
  const std::string ex = "experts.";
  auto fused = [&](const std::string& proj, int64_t rows) {  // shared_experts: [d, 2S] and [1, S, d]
    if (proj == hf::kDownProj) return Source{blk + "shared_experts.w_down", Cut::DownT, -1, {1, rows, d}, {}};
    return Source{
        blk + "shared_experts.w_up_gate", proj == hf::kUpProj ? Cut::UpT : Cut::GateT, -1, {d, 2 * rows}, {}};
  };
  if (mlp.compare(0, ex.size(), ex) == 0) {
    const size_t dot = mlp.find('.', ex.size());
    const int64_t e = std::stoll(mlp.substr(ex.size(), dot - ex.size()));
    const std::string proj = mlp.substr(dot + 1);
    const int64_t E = c.n_routed_experts, H = c.moe_intermediate_size;
    const int64_t L = c.latent_moe_dim > 0 ? c.latent_moe_dim : d;
    if (proj == hf::kDownProj)
      return Source{blk + "routed_experts.w_down", Cut::ExpertDownT, e, {E, H, L}, {}};
    return Source{blk + "routed_experts.w_up_gate",
                  proj == hf::kUpProj ? Cut::ExpertUp : Cut::ExpertGate,
                  e,
                  {E, 2 * H, L},
                  {}};
  }
  const std::string sh = "shared_expert.";
  if (mlp.compare(0, sh.size(), sh) == 0)
    return fused(mlp.substr(sh.size()), c.shared_expert_intermediate_size);
  if (c.is_dense_layer(p.layer)) return fused(mlp, c.dense_mlp_intermediate_size);
  return Source{};
}

}  // namespace

std::string hf_name(const std::string& n) {
  static const std::map<std::string, std::string> global = {{"embeddings.weight", hf::kEmbedTokens},
                                                            {"lm_head.norm.weight", hf::kFinalNorm},
                                                            {"lm_head.w_out.weight", hf::kLmHead}};
  if (auto it = global.find(n); it != global.end()) return it->second;
  std::string rest;
  const int64_t l = block_of(n, &rest);
  if (l < 0) return "";
  for (const auto& [oc, hfs] : dense_pairs())
    if (oc == rest) return hf::layer(l) + hfs;
  return "";
}

Source source_of(const ParamSpec& p, const ModelConfig& c) {
  static const std::map<std::string, std::string> global = {{hf::kEmbedTokens, "embeddings.weight"},
                                                            {hf::kEmbedNorm, "embedding_norm.weight"},
                                                            {hf::kFinalNorm, "lm_head.norm.weight"},
                                                            {hf::kLmHead, "lm_head.w_out.weight"}};
  if (auto it = global.find(p.name); it != global.end())
    return Source{it->second, Cut::Whole, -1, p.shape, {}};
  if (p.layer < 0) return Source{};
  const std::string pre = hf::layer(p.layer), blk = "blocks." + std::to_string(p.layer) + ".";
  if (p.name.compare(0, pre.size(), pre) != 0) return Source{};
  const std::string rest = p.name.substr(pre.size());
  for (const auto& [oc, hfs] : c.is_moe() ? hybrid_pairs() : dense_pairs()) {
    if (hfs != rest) continue;
    Source s{blk + oc, Cut::Whole, -1, p.shape, {}};
    if (oc == "routed_experts_router.weight") s.shape = {shape_numel(p.shape)};  // stored flat [E * d]
    return s;
  }
  const std::string m = hf::kMlp;
  if (c.is_moe() && rest.compare(0, m.size(), m) == 0)
    return hybrid_mlp_source(blk, rest.substr(m.size()), p, c);
  return Source{};
}

std::string dcp_dir_of(const std::string& step_dir) {
  const std::string sub = step_dir + "/model_and_optim";
  return distcp::is_dcp_dir(sub) ? sub : step_dir;
}

bool is_olmo_core_dir(const std::string& dir) { return distcp::is_dcp_dir(dcp_dir_of(dir)); }

struct SourceCache {
  std::mutex mu;
  std::vector<std::pair<std::string, Tensor>> recent;  // at most 2: a layer's w_up_gate and w_down
};

namespace {

// The OLMo-core parameter name a checkpoint key holds, or "" for optimizer state, buffers and the like:
// "model.[module.]<name>" (save_model_and_optim_state) or "[module.]<name>.main" (save_state_dict_direct).
std::string param_of_key(const std::string& key) {
  std::string n;
  if (key.compare(0, 6, kModelPrefix) == 0) {
    n = key.substr(6);
  } else if (key.size() > 5 && key.compare(key.size() - 5, 5, ".main") == 0) {
    n = key.substr(0, key.size() - 5);
  } else {
    return "";
  }
  for (bool again = true;
       again;) {  // DDP / torch.compile wrapper prefixes (OLMo-core's _strip_wrapper_prefixes)
    again = false;
    for (const std::string pre : {"module.", "_orig_mod."}) {
      if (n.compare(0, pre.size(), pre) == 0) {
        n = n.substr(pre.size());
        again = true;
      }
    }
  }
  return n;
}

// Binds every registry tensor to its checkpoint key, checking names, shapes (shaped or flat) and dtypes.
void bind_tensors(Checkpoint& c, const std::string& ctx) {
  std::map<std::string, std::string> key_of_param;  // OLMo-core name -> distcp key
  for (const auto& [key, e] : c.dcp.tensors()) {
    const std::string n = param_of_key(key);
    if (n.empty()) continue;
    auto [it, fresh] = key_of_param.emplace(n, key);
    OLMO_CHECK(fresh, ctx, ": parameter '", n, "' is stored twice, as '", it->second, "' and '", key, "'");
  }
  std::set<std::string> used;
  for (const auto& p : c.registry) {
    Source s = source_of(p, c.config);
    OLMO_CHECK(!s.name.empty(), ctx, ": no OLMo-core parameter is known for the HF tensor ", p.name);
    auto it = key_of_param.find(s.name);
    OLMO_CHECK(it != key_of_param.end(), ctx, ": missing OLMo-core parameter '", s.name, "' ",
               shape_str(s.shape), " (for HF ", p.name, "; looked for model.", s.name, " and ", s.name,
               ".main)");
    const distcp::TensorEntry& e = c.dcp.at(it->second);
    OLMO_CHECK(e.dtype, ctx, ": tensor '", it->second, "' has dtype ", e.torch_dtype,
               " (expected torch.float32, torch.bfloat16 or torch.float16)");
    const bool flat = e.shape.size() == 1 && s.shape.size() != 1 && e.shape[0] == shape_numel(s.shape) &&
                      it->second.compare(0, 6, kModelPrefix) != 0;
    if (e.shape != s.shape && !flat) {
      if (s.cut == Cut::Whole && e.shape.size() == s.shape.size())  // phrased as the registry check does
        throw Error(ctx + ": " + p.name + " is " + shape_str(e.shape) + ", expected " + shape_str(s.shape) +
                    " (checkpoint tensor '" + it->second + "')");
      throw Error(ctx + ": checkpoint tensor '" + it->second + "' is " + shape_str(e.shape) + ", expected " +
                  shape_str(s.shape) + " (OLMo-core's " + s.name + ", or flattened to [" +
                  std::to_string(shape_numel(s.shape)) + "] as <name>.main; it holds HF " + p.name + ")");
    }
    s.hf_shape = p.shape;
    c.key_of[p.name] = it->second;
    c.source[p.name] = s;
    used.insert(s.name);
  }
  std::vector<std::string> unknown;
  for (const auto& [n, key] : key_of_param) {
    if (used.count(n)) continue;
    const std::string h = hf_name(n);
    unknown.push_back(key + " " + shape_str(c.dcp.at(key).shape) + (h.empty() ? "" : " (HF " + h + ")"));
  }
  if (!unknown.empty()) {
    std::ostringstream os;
    os << ctx << ": " << unknown.size() << " unexpected model tensor(s), not parameters of this "
       << c.config.model_type_name << " config:";
    for (size_t k = 0; k < unknown.size() && k < 20; ++k) os << "\n    " << unknown[k];
    throw Error(os.str());
  }
}

}  // namespace

Checkpoint open(const std::string& step_dir, const std::string& config_json) {
  std::error_code ec;
  OLMO_CHECK(fs::is_directory(step_dir, ec), "OLMo-core checkpoint ", step_dir,
             " does not exist or is not a directory");
  std::string cfg = config_json;
  if (cfg.empty()) {
    cfg = step_dir + "/config.json";
    if (!fs::exists(cfg, ec) && fs::path(step_dir).filename() == "model_and_optim")
      cfg = fs::path(step_dir).parent_path().string() + "/config.json";
  }
  Checkpoint c;
  c.config = load_config(cfg);
  c.registry = param_registry(c.config);
  c.dcp = distcp::Checkpoint::open(dcp_dir_of(step_dir));
  c.cache = std::make_shared<SourceCache>();
  bind_tensors(c, c.dcp.dir() + " (with the config " + cfg + ")");
  return c;
}

Tensor Checkpoint::read(const std::string& hf) const {
  auto it = key_of.find(hf);
  OLMO_CHECK(it != key_of.end(), dcp.dir(), ": no tensor for '", hf, "'");
  const Source& s = source.at(hf);
  const Shape& want = s.hf_shape;
  if (s.cut == Cut::Whole) return dcp.read(it->second).view(want);
  Tensor full;
  {
    std::lock_guard<std::mutex> lock(cache->mu);
    bool found = false;
    for (const auto& [k, t] : cache->recent) {
      if (k == it->second) {
        full = t;
        found = true;
      }
    }
    if (!found) {
      if (cache->recent.size() >= 2) cache->recent.erase(cache->recent.begin());
      full = dcp.read(it->second).view(s.shape);
      cache->recent.emplace_back(it->second, full);
    }
  }
  const int64_t half = s.shape.size() > 1 ? s.shape[1] / 2 : 0;
  Tensor out;
  switch (s.cut) {
    case Cut::ExpertUp:
      out = full.select(0, s.expert).slice(0, 0, half);
      break;
    case Cut::ExpertGate:
      out = full.select(0, s.expert).slice(0, half, 2 * half);
      break;
    case Cut::ExpertDownT:
      out = full.select(0, s.expert).transpose(0, 1);
      break;
    case Cut::UpT:
      out = full.slice(1, 0, half).transpose(0, 1);
      break;
    case Cut::GateT:
      out = full.slice(1, half, 2 * half).transpose(0, 1);
      break;
    case Cut::DownT:
      out = full.select(0, 0).transpose(0, 1);
      break;
    case Cut::Whole:
      break;
  }
  out = out.clone();
  OLMO_CHECK(out.shape() == want, dcp.dir(), ": ", hf, " cut from '", it->second, "' is ",
             shape_str(out.shape()), ", expected ", shape_str(want));
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t b = 0;
  std::set<std::string> keys;
  for (const auto& [hf, key] : key_of)
    if (keys.insert(key).second) b += dcp.at(key).nbytes();
  return b;
}

std::vector<safetensors::NamedTensor> Checkpoint::lazy_named(
    std::function<void(const std::string&, uint64_t)> on_read) const {
  std::vector<safetensors::NamedTensor> out;
  for (const auto& p : registry) {
    const distcp::TensorEntry& e = dcp.at(key_of.at(p.name));
    safetensors::NamedTensor t{p.name, safetensors::placeholder(p.shape, *e.dtype)};
    t.load = [this, name = p.name, on_read] {
      Tensor x = read(name);
      if (on_read) on_read(name, x.nbytes());
      return x;
    };
    out.push_back(std::move(t));
  }
  return out;
}

std::string model_info(const Checkpoint& c, const std::string& step_dir) {
  std::ostringstream os;
  auto pc = count_params(c.config, c.registry);
  std::map<DType, size_t> dt;
  std::set<std::string> keys;
  for (const auto& [hf, key] : c.key_of) {
    dt[*c.dcp.at(key).dtype]++;
    keys.insert(key);
  }
  std::set<std::string> files;
  for (const auto& [key, e] : c.dcp.tensors()) {
    for (const auto& ch : e.chunks) files.insert(ch.file);
  }
  os << "directory           " << step_dir << " (OLMo-core distributed checkpoint, " << c.dcp.dir() << ")\n"
     << config_summary(c.config) << "parameters          " << pc.total << "\ntensors             "
     << pc.tensors << " (from " << keys.size() << " checkpoint tensors; plus "
     << c.dcp.tensors().size() - keys.size() << " optimizer/other tensors and "
     << c.dcp.metadata().byte_entries.size() << " byte entries, not read)\nstored dtypes       ";
  for (const auto& [d, n] : dt) os << dtype_name(d) << " x" << n << "  ";
  os << "\nweights             " << files.size() << " .distcp file(s), " << c.total_bytes()
     << " bytes of model tensor data\n";
  return os.str();
}

}  // namespace olmosft::model::olmo_core
