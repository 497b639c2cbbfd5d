#include "model/olmo_core.h"

#include <filesystem>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace olmosft::model::olmo_core {

namespace {

constexpr const char* kModelPrefix = "model.";  // OLMo-core's checkpoint keys: "model.<parameter name>"

// Reads a key of an OLMo-core config object with a type check; `path` is the dotted key for errors.
struct Cfg {
  const std::string& ctx;
  const json& get(const json& j, const std::string& path, const char* key) const {
    OLMO_CHECK(j.is_object() && j.contains(key), ctx, ": missing ", path, ".", key);
    return j.at(key);
  }
  const json* opt(const json& j, const char* key) const {
    return j.is_object() && j.contains(key) && !j.at(key).is_null() ? &j.at(key) : nullptr;
  }
  int64_t integer(const json& j, const std::string& path, const char* key) const {
    const json& v = get(j, path, key);
    OLMO_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, ctx, ": ", path, ".", key,
               " must be a positive integer, got ", v.dump());
    return v.get<int64_t>();
  }
  double number(const json& j, const std::string& path, const char* key) const {
    const json& v = get(j, path, key);
    OLMO_CHECK(v.is_number(), ctx, ": ", path, ".", key, " must be a number, got ", v.dump());
    return v.get<double>();
  }
  void must_be(const json& j, const std::string& path, const char* key, const json& want,
               const char* why) const {
    const json* v = opt(j, key);
    json got = v ? *v : json();
    OLMO_CHECK(got == want || (want.is_boolean() && !want.get<bool>() && got.is_null()), ctx, ": ", path, ".",
               key, " is ", got.dump(), ", only ", want.dump(), " is supported (", why, ")");
  }
  void must_be_null(const json& j, const std::string& path, const char* key, const char* why) const {
    const json* v = opt(j, key);
    OLMO_CHECK(!v || (v->is_boolean() && !v->get<bool>()), ctx, ": ", path, ".", key, " is ",
               v ? v->dump() : "", ", which this import does not support (", why, ")");
  }
};

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

json hf_config_json(const json& root, const std::string& ctx) {
  Cfg c{ctx};
  const json& m = model_of(root, ctx);
  c.must_be(m, "model", "name", "default", "the plain transformer; MoE and normalized models are not mapped");
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

std::string hf_name(const std::string& n) {
  static const std::map<std::string, std::string> global = {{"embeddings.weight", hf::kEmbedTokens},
                                                            {"lm_head.norm.weight", hf::kFinalNorm},
                                                            {"lm_head.w_out.weight", hf::kLmHead}};
  if (auto it = global.find(n); it != global.end()) return it->second;
  const std::string pre = "blocks.";
  if (n.compare(0, pre.size(), pre) != 0) return "";
  size_t dot = n.find('.', pre.size());
  if (dot == std::string::npos || dot == pre.size() || dot - pre.size() > 9) return "";
  const std::string num = n.substr(pre.size(), dot - pre.size());
  if (num.find_first_not_of("0123456789") != std::string::npos || (num.size() > 1 && num[0] == '0'))
    return "";
  const std::string rest = n.substr(dot + 1);
  static const std::map<std::string, std::string> per_layer = {
      {"attention.w_q.weight", std::string(hf::kSelfAttn) + hf::kQProj},
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
  auto it = per_layer.find(rest);
  return it == per_layer.end() ? "" : hf::layer(std::stoll(num)) + it->second;
}

std::string dcp_dir_of(const std::string& step_dir) {
  const std::string sub = step_dir + "/model_and_optim";
  return distcp::is_dcp_dir(sub) ? sub : step_dir;
}

bool is_olmo_core_dir(const std::string& dir) { return distcp::is_dcp_dir(dcp_dir_of(dir)); }

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
  std::map<std::string, Shape> shapes;
  std::map<std::string, DType> dtypes;
  std::vector<std::string> unknown;
  for (const auto& [key, e] : c.dcp.tensors()) {
    if (key.compare(0, 6, kModelPrefix) != 0) continue;  // optimizer state and the like: skipped
    std::string hf = hf_name(key.substr(6));
    if (hf.empty()) {
      unknown.push_back(key + " " + shape_str(e.shape));
      continue;
    }
    OLMO_CHECK(e.dtype, c.dcp.dir(), ": tensor '", key, "' has dtype ", e.torch_dtype,
               " (expected torch.float32, torch.bfloat16 or torch.float16)");
    c.key_of[hf] = key;
    shapes[hf] = e.shape;
    dtypes[hf] = *e.dtype;
  }
  if (!unknown.empty()) {
    std::ostringstream os;
    os << c.dcp.dir() << ": " << unknown.size() << " model tensor(s) with no Olmo 3 (HF) name:";
    for (size_t k = 0; k < unknown.size() && k < 20; ++k) os << "\n    " << unknown[k];
    throw Error(os.str());
  }
  try {
    check_against_registry(c.config, shapes, dtypes, c.dcp.dir() + " (with the config " + cfg + ")");
  } catch (const Error& e) {  // the listing uses HF names: say which checkpoint keys they are
    std::ostringstream os;
    os << e.what() << "\n  (HF name <- checkpoint key:";
    size_t n = 0;
    for (const auto& [hf, key] : c.key_of) {
      if (std::string(e.what()).find(hf + " ") != std::string::npos && n++ < 20)
        os << "\n    " << hf << " <- " << key;
    }
    os << ")";
    throw Error(os.str());
  }
  return c;
}

Tensor Checkpoint::read(const std::string& hf) const {
  auto it = key_of.find(hf);
  OLMO_CHECK(it != key_of.end(), dcp.dir(), ": no tensor for '", hf, "'");
  return dcp.read(it->second);
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t b = 0;
  for (const auto& [hf, key] : key_of) b += dcp.at(key).nbytes();
  return b;
}

std::vector<safetensors::NamedTensor> Checkpoint::lazy_named(
    std::function<void(const std::string&, uint64_t)> on_read) const {
  std::vector<safetensors::NamedTensor> out;
  for (const auto& p : registry) {
    const distcp::TensorEntry& e = dcp.at(key_of.at(p.name));
    safetensors::NamedTensor t{p.name, safetensors::placeholder(e.shape, *e.dtype)};
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
  for (const auto& [hf, key] : c.key_of) dt[*c.dcp.at(key).dtype]++;
  std::set<std::string> files;
  for (const auto& [key, e] : c.dcp.tensors()) {
    for (const auto& ch : e.chunks) files.insert(ch.file);
  }
  os << "directory           " << step_dir << " (OLMo-core distributed checkpoint, " << c.dcp.dir() << ")\n"
     << config_summary(c.config) << "parameters          " << pc.total << "\ntensors             "
     << pc.tensors << " (plus " << c.dcp.tensors().size() - c.key_of.size() << " optimizer/other tensors and "
     << c.dcp.metadata().byte_entries.size() << " byte entries, not read)\nstored dtypes       ";
  for (const auto& [d, n] : dt) os << dtype_name(d) << " x" << n << "  ";
  os << "\nweights             " << files.size() << " .distcp file(s), " << c.total_bytes()
     << " bytes of model tensor data\n";
  return os.str();
}

}  // namespace olmosft::model::olmo_core
