#include "model/config.h"

#include <cmath>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "io/json.h"
#include "model/model.h"

namespace olmosft::model {

using json = nlohmann::json;

const char* layer_type_name(LayerType t) {
  switch (t) {
    case LayerType::SlidingAttention:
      return "sliding_attention";
    case LayerType::FullAttention:
      return "full_attention";
    case LayerType::LinearAttention:
      return "linear_attention";
  }
  return "?";
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::BF16:
      return "bfloat16";
    case DType::F32:
      return "float32";
    case DType::F16:
      return "float16";
    default:
      fail("no HF torch_dtype for ", dtype_name(t));
  }
}

bool ModelConfig::is_dense_layer(int64_t layer) const {
  if (!is_moe()) return true;
  for (int64_t d : dense_layers_indices) {
    if (d == layer) return true;
  }
  return false;
}

const RopeParams& ModelConfig::rope_for(int64_t layer) const {
  return layer_types.at(static_cast<size_t>(layer)) == LayerType::SlidingAttention ? rope_sliding : rope_full;
}

namespace {

// Typed accessors over a JSON object. Absent means "use the default". Null: inside rope_scaling /
// rope_parameters, transformers reads a None value as its default, so null is the default there too
// (null_is_default). At the top level transformers assigns the None to the attribute, which is not the
// default (sliding_window None is no window at all; rms_norm_eps None fails), so a null number or flag is an
// error there rather than a silent 4096 or 1e-5.
struct Obj {
  const json& j;
  std::string ctx;  // "config.json" or "config.json: rope_scaling"
  bool null_is_default = false;

  // Present and not null (keys whose None means "none" in transformers: token ids, rope_scaling, ...).
  bool has(const std::string& k) const { return j.contains(k) && !j.at(k).is_null(); }
  // Present, for a number or flag with a default: null is an error unless null_is_default.
  bool given(const std::string& k) const {
    if (!j.contains(k)) return false;
    if (!j.at(k).is_null()) return true;
    // transformers' configs map None to the default themselves for these (e.g. Olmo3Config:
    // num_key_value_heads None -> num_attention_heads).
    static const std::set<std::string> kNoneIsDefault = {"num_key_value_heads",    "head_dim",
                                                         "attention_hidden_size",  "linear_num_key_heads",
                                                         "linear_num_value_heads", "linear_key_head_dim",
                                                         "linear_value_head_dim"};
    if (!null_is_default && !kNoneIsDefault.count(k))
      fail(ctx, ": key '", k,
           "' is null; olmosft does not read null as the default (transformers would use None, a different "
           "model): remove the key to get the default, or give a value");
    return false;
  }
  [[noreturn]] void bad(const std::string& k, const std::string& expected) const {
    fail(ctx, ": key '", k, "' must be ", expected, ", got ", io::json_excerpt(j.at(k)));
  }
  void require(const std::string& k) const { OLMO_CHECK(has(k), ctx, ": missing required key '", k, "'"); }
  int64_t integer(const std::string& k) const {
    const json& v = j.at(k);
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    bad(k, "an integer");
  }
  int64_t integer(const std::string& k, int64_t def) const { return given(k) ? integer(k) : def; }
  int64_t req_integer(const std::string& k) const {
    require(k);
    return integer(k);
  }
  int64_t positive(const std::string& k, int64_t def) const {
    int64_t v = integer(k, def);
    if (v <= 0) {
      if (has(k)) bad(k, "a positive integer");
      fail(ctx, ": key '", k, "' is required (no usable default)");
    }
    return v;
  }
  int64_t req_positive(const std::string& k) const {
    require(k);
    return positive(k, 0);
  }
  std::optional<int64_t> opt_integer(const std::string& k) const {
    if (!has(k)) return std::nullopt;
    return integer(k);
  }
  double number(const std::string& k, double def) const {
    if (!given(k)) return def;
    const json& v = j.at(k);
    if (!v.is_number()) bad(k, "a number");
    double d = v.get<double>();
    if (!std::isfinite(d)) bad(k, "a finite number");
    return d;
  }
  bool boolean(const std::string& k, bool def) const {
    if (!given(k)) return def;
    if (!j.at(k).is_boolean()) bad(k, "true or false");
    return j.at(k).get<bool>();
  }
  std::string string(const std::string& k, const std::string& def) const {
    if (!has(k)) return def;
    if (!j.at(k).is_string()) bad(k, "a string");
    return j.at(k).get<std::string>();
  }
};

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// One rope parameter object (rope_scaling, or one rope_parameters entry). `base` supplies rope_theta.
RopeParams parse_rope(const json& rj, const std::string& ctx, double theta, int64_t max_pos) {
  OLMO_CHECK(rj.is_object(), ctx, ": must be an object, got ", io::json_excerpt(rj));
  static const std::set<std::string> known = {
      "rope_type",      "type",      "factor",           "original_max_position_embeddings",
      "beta_fast",      "beta_slow", "attention_factor", "mscale",
      "mscale_all_dim", "truncate",  "rope_theta"};
  for (auto it = rj.begin(); it != rj.end(); ++it) {
    OLMO_CHECK(known.count(it.key()), ctx, ": unknown key '", it.key(), "'");
  }
  Obj o{rj, ctx, true};
  RopeParams p;
  p.rope_theta = o.number("rope_theta", theta);
  OLMO_CHECK(p.rope_theta > 0, ctx, ": key 'rope_theta' must be positive");
  std::string type = o.string("rope_type", o.string("type", "default"));
  if (o.has("rope_type") && o.has("type")) {
    OLMO_CHECK(o.string("rope_type", "") == o.string("type", ""), ctx, ": 'rope_type' and 'type' disagree");
  }
  p.rope_type = type;
  if (type == "default") return p;
  OLMO_CHECK(type == "yarn" || type == "linear", ctx, ": rope_type '", type,
             "' is not supported (expected default, linear or yarn)");
  o.require("factor");
  p.factor = o.number("factor", 1.0);
  OLMO_CHECK(p.factor >= 1.0, ctx, ": key 'factor' must be >= 1, got ", p.factor);
  if (type == "linear") return p;
  p.original_max_position_embeddings = o.integer("original_max_position_embeddings", max_pos);
  OLMO_CHECK(p.original_max_position_embeddings > 0, ctx,
             ": key 'original_max_position_embeddings' must be positive");
  if (o.has("original_max_position_embeddings")) {
    // HF recomputes factor = max_position_embeddings / original_max_position_embeddings; a config whose
    // factor says otherwise is inconsistent.
    double implied = static_cast<double>(max_pos) / static_cast<double>(p.original_max_position_embeddings);
    OLMO_CHECK(std::fabs(implied - p.factor) <= 1e-9 * p.factor, ctx, ": 'factor' ", p.factor,
               " is inconsistent with max_position_embeddings / original_max_position_embeddings = ", max_pos,
               " / ", p.original_max_position_embeddings, " = ", implied);
  }
  p.beta_fast = o.number("beta_fast", 32.0);
  p.beta_slow = o.number("beta_slow", 1.0);
  OLMO_CHECK(p.beta_fast > 0 && p.beta_slow > 0, ctx, ": 'beta_fast' and 'beta_slow' must be positive");
  OLMO_CHECK(p.beta_fast > p.beta_slow, ctx, ": 'beta_fast' (", p.beta_fast, ") must exceed 'beta_slow' (",
             p.beta_slow, ")");
  p.truncate = o.boolean("truncate", true);
  if (o.has("attention_factor")) {
    p.attention_factor = o.number("attention_factor", 1.0);
    OLMO_CHECK(p.attention_factor > 0, ctx, ": 'attention_factor' must be positive");
  } else if (o.has("mscale") && o.has("mscale_all_dim")) {
    p.attention_factor = yarn_mscale(p.factor, o.number("mscale", 1.0)) /
                         yarn_mscale(p.factor, o.number("mscale_all_dim", 1.0));
  } else {
    p.attention_factor = yarn_mscale(p.factor, 1.0);
  }
  return p;
}

void parse_rope_settings(ModelConfig& c, const Obj& o) {
  double theta = o.number("rope_theta", 10000.0);
  OLMO_CHECK(theta > 0, o.ctx, ": key 'rope_theta' must be positive");
  std::optional<RopeParams> legacy_full;
  RopeParams dflt;
  dflt.rope_theta = theta;
  if (o.has("rope_scaling")) {
    legacy_full =
        parse_rope(o.j.at("rope_scaling"), o.ctx + ": rope_scaling", theta, c.max_position_embeddings);
  }
  if (o.has("rope_parameters")) {
    const json& rp = o.j.at("rope_parameters");
    std::string ctx = o.ctx + ": rope_parameters";
    OLMO_CHECK(rp.is_object(), ctx, ": must be an object");
    bool per_type =
        rp.contains("full_attention") || rp.contains("sliding_attention") || rp.contains("linear_attention");
    if (per_type) {
      for (auto it = rp.begin(); it != rp.end(); ++it) {
        OLMO_CHECK(
            it.key() == "full_attention" || it.key() == "sliding_attention" || it.key() == "linear_attention",
            ctx, ": unknown layer type '", it.key(), "'");
      }
      c.rope_full =
          rp.contains("full_attention")
              ? parse_rope(rp.at("full_attention"), ctx + ".full_attention", theta, c.max_position_embeddings)
              : dflt;
      c.rope_sliding = rp.contains("sliding_attention")
                           ? parse_rope(rp.at("sliding_attention"), ctx + ".sliding_attention", theta,
                                        c.max_position_embeddings)
                           : dflt;
    } else {
      c.rope_full = c.rope_sliding = parse_rope(rp, ctx, theta, c.max_position_embeddings);
    }
    if (legacy_full) {
      OLMO_CHECK(
          *legacy_full == c.rope_full, o.ctx,
          ": 'rope_scaling' and 'rope_parameters' are both given and disagree for full_attention layers");
    }
    return;
  }
  // Legacy form: rope_scaling applies to the full-attention layers only (docs/reference/architecture.md
  // A.1/A.4); sliding layers use default RoPE with rope_theta.
  c.rope_full = legacy_full ? *legacy_full : dflt;
  c.rope_sliding = dflt;
}

std::vector<LayerType> parse_layer_types(const Obj& o, const ModelConfig& c) {
  std::vector<LayerType> out;
  const std::string k = "layer_types";
  const bool hybrid = c.model_type == ModelType::OlmoHybrid;
  if (!o.has(k)) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if (hybrid) {  // HF: full_attention where i % 4 == 3 (the last layer when none is), else linear
        const bool full = i % 4 == 3 || (c.num_hidden_layers < 4 && i == c.num_hidden_layers - 1);
        out.push_back(full ? LayerType::FullAttention : LayerType::LinearAttention);
        continue;
      }
      // HF defaults: olmo3 (i+1) % 4 != 0 -> sliding; olmo3moe (i+1) % 2 != 0 -> sliding.
      int64_t period = c.is_moe() ? 2 : 4;
      out.push_back((i + 1) % period != 0 ? LayerType::SlidingAttention : LayerType::FullAttention);
    }
    return out;
  }
  const json& v = o.j.at(k);
  OLMO_CHECK(v.is_array(), o.ctx, ": key 'layer_types' must be an array of strings");
  OLMO_CHECK(static_cast<int64_t>(v.size()) == c.num_hidden_layers, o.ctx, ": 'layer_types' has ", v.size(),
             " entries but num_hidden_layers is ", c.num_hidden_layers);
  const char* expected = hybrid       ? "linear_attention, full_attention (olmo_hybrid has no sliding window)"
                         : c.is_moe() ? "sliding_attention, full_attention, linear_attention"
                                      : "sliding_attention, full_attention";
  for (size_t i = 0; i < v.size(); ++i) {
    std::string s = v[i].is_string() ? v[i].get<std::string>() : v[i].dump();
    if (s == "sliding_attention" && !hybrid)
      out.push_back(LayerType::SlidingAttention);
    else if (s == "full_attention")
      out.push_back(LayerType::FullAttention);
    else if (s == "linear_attention" && (c.is_moe() || hybrid))
      out.push_back(LayerType::LinearAttention);
    else
      fail(o.ctx, ": layer_types[", i, "] = ", io::json_excerpt(v[i]), " is not supported for ",
           c.model_type_name, " (expected ", expected, ")");
  }
  return out;
}

void check_heads(const ModelConfig& c, const Obj& o, int64_t width, const char* width_key) {
  OLMO_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, o.ctx, ": num_key_value_heads (",
             c.num_key_value_heads, ") must divide num_attention_heads (", c.num_attention_heads, ")");
  if (!o.has("head_dim")) {
    OLMO_CHECK(width % c.num_attention_heads == 0, o.ctx, ": num_attention_heads (", c.num_attention_heads,
               ") must divide ", width_key, " (", width, ") when head_dim is not given");
  }
}

// Per-section readers of parse_config (each reads its keys from o into c; o.ctx names the file).

// Sizes, activation, norms, dropout, initialisation, layer types.
void read_shared(const Obj& o, ModelConfig& c) {
  const std::string& context = o.ctx;
  c.vocab_size = o.req_positive("vocab_size");
  c.hidden_size = o.req_positive("hidden_size");
  c.num_hidden_layers = o.req_positive("num_hidden_layers");
  c.num_attention_heads = o.req_positive("num_attention_heads");
  c.num_key_value_heads = o.positive("num_key_value_heads", c.num_attention_heads);
  c.hidden_act = o.string("hidden_act", "silu");
  OLMO_CHECK(c.hidden_act == "silu", context, ": key 'hidden_act' is '", c.hidden_act,
             "', only 'silu' is supported");
  const bool hybrid = c.model_type == ModelType::OlmoHybrid;  // OlmoHybridConfig's own defaults
  c.rms_norm_eps = o.number("rms_norm_eps", hybrid ? 1e-6 : 1e-5);
  OLMO_CHECK(c.rms_norm_eps > 0, context, ": key 'rms_norm_eps' must be positive");
  c.max_position_embeddings = o.positive("max_position_embeddings", hybrid ? 65536 : 2048);
  c.tie_word_embeddings = o.boolean("tie_word_embeddings", false);
  c.attention_bias = o.boolean("attention_bias", false);
  OLMO_CHECK(!c.attention_bias, context,
             ": key 'attention_bias' = true is not supported (Olmo models have none)");
  c.attention_dropout = o.number("attention_dropout", 0.0);
  OLMO_CHECK(c.attention_dropout >= 0 && c.attention_dropout < 1, context,
             ": 'attention_dropout' must be in [0, 1)");
  c.initializer_range = o.number("initializer_range", 0.02);
  c.layer_types = parse_layer_types(o, c);
}

// eos / bos / pad token ids, validated against the vocabulary.
void read_token_ids(const Obj& o, ModelConfig& c) {
  const std::string& context = o.ctx;
  const json& j = o.j;
  auto token_id = [&](const std::string& k, const json& v) {
    OLMO_CHECK(v.is_number_integer(), context, ": key '", k, "' must be an integer token id, got ",
               io::json_excerpt(v));
    int64_t id = v.get<int64_t>();
    OLMO_CHECK(id >= 0 && id < c.vocab_size, context, ": key '", k, "' = ", id,
               " is outside the vocabulary [0, ", c.vocab_size, ")");
    return id;
  };
  if (o.has("eos_token_id")) {
    const json& e = j.at("eos_token_id");
    if (e.is_array()) {
      for (const auto& x : e) c.eos_token_ids.push_back(token_id("eos_token_id", x));
    } else {
      c.eos_token_ids.push_back(token_id("eos_token_id", e));
    }
  }
  if (o.has("bos_token_id")) c.bos_token_id = token_id("bos_token_id", j.at("bos_token_id"));
  if (o.has("pad_token_id")) c.pad_token_id = token_id("pad_token_id", j.at("pad_token_id"));
  if (c.model_type == ModelType::OlmoHybrid) {
    // OlmoHybridConfig's defaults when the key is absent (an explicit null means none); a vocabulary too
    // small for them (test models) leaves them unset.
    if (!j.contains("eos_token_id") && c.vocab_size > 100257) c.eos_token_ids = {100257};
    if (!j.contains("pad_token_id") && c.vocab_size > 100277) c.pad_token_id = 100277;
  }
}

// torch_dtype / dtype (they must agree when both are given).
void read_dtype(const Obj& o, ModelConfig& c) {
  const std::string& context = o.ctx;
  for (const char* k : {"torch_dtype", "dtype"}) {
    if (!o.has(k)) continue;
    std::string d = o.string(k, "");
    std::optional<DType> t;
    if (d == "bfloat16")
      t = DType::BF16;
    else if (d == "float32")
      t = DType::F32;
    else if (d == "float16")
      t = DType::F16;
    else
      fail(context, ": key '", k, "' = '", d, "' is not supported (expected bfloat16, float32 or float16)");
    OLMO_CHECK(!c.torch_dtype || *c.torch_dtype == *t, context, ": 'torch_dtype' and 'dtype' disagree");
    c.torch_dtype = t;
  }
}

// olmo3moe: the softmax-attention layers.
void read_hybrid_attention(const Obj& o, ModelConfig& c) {
  const std::string& context = o.ctx;
  c.attention_hidden_size = o.positive("attention_hidden_size", c.hidden_size);
  check_heads(c, o, c.attention_hidden_size, "attention_hidden_size");
  c.head_dim = o.positive("head_dim", c.attention_hidden_size / c.num_attention_heads);
  c.use_rope = o.boolean("use_rope", true);
  c.use_head_qk_norm = o.boolean("use_head_qk_norm", false);
  c.qk_norm_per_head_gains = o.boolean("qk_norm_per_head_gains", false);
  c.scalable_softmax = o.boolean("scalable_softmax", false);
  c.attention_gate_type = o.string("attention_gate_type", "");
  OLMO_CHECK(c.attention_gate_type.empty() || c.attention_gate_type == "elementwise", context,
             ": key 'attention_gate_type' = '", c.attention_gate_type,
             "' is not supported (expected null or \"elementwise\")");
  c.attention_gate_full_precision = o.boolean("attention_gate_full_precision", true);
  OLMO_CHECK(
      c.use_head_qk_norm == c.qk_norm_per_head_gains, context,
      ": use_head_qk_norm and qk_norm_per_head_gains must both be true (per-head gains [heads, head_dim], as "
      "Olmo 3.5) or both false (whole-vector q/k norms); the mixed layout has no verified tensor shapes");
}

// olmo3moe: the KDA (linear_attention) layers.
void read_kda(const Obj& o, ModelConfig& c) {
  const std::string& context = o.ctx;
  bool any_linear = false;
  for (auto t : c.layer_types) any_linear |= t == LayerType::LinearAttention;
  c.linear_conv_kernel_dim = o.positive("linear_conv_kernel_dim", 4);
  c.linear_allow_neg_eigval = o.boolean("linear_allow_neg_eigval", false);
  c.linear_norm_eps = o.number("linear_norm_eps", 1e-5);
  OLMO_CHECK(c.linear_norm_eps > 0, context, ": key 'linear_norm_eps' must be positive");
  if (any_linear) {
    c.linear_num_key_heads = o.req_positive("linear_num_key_heads");
    c.linear_num_value_heads = o.positive("linear_num_value_heads", c.linear_num_key_heads);
    OLMO_CHECK(c.linear_num_value_heads == c.linear_num_key_heads, context, ": linear_num_value_heads (",
               c.linear_num_value_heads, ") must equal linear_num_key_heads (", c.linear_num_key_heads,
               ") for KDA");
    c.linear_key_head_dim = o.req_positive("linear_key_head_dim");
    c.linear_value_head_dim = o.req_positive("linear_value_head_dim");
  }
}

// olmo_hybrid: RoPE is off exactly when rope_theta is null (transformers: rope_parameters["rope_theta"] is
// None; OLMo-core writes a top-level "rope_theta": null). Absent, it is 10000 (RoPE on).
bool olmo_hybrid_nope(const Obj& o) {
  const json& j = o.j;
  if (j.contains("rope_parameters") && j.at("rope_parameters").is_object()) {
    const json& rp = j.at("rope_parameters");
    if (rp.contains("rope_theta")) return rp.at("rope_theta").is_null();
  }
  return j.contains("rope_theta") && j.at("rope_theta").is_null();
}

// olmo_hybrid: the dense SwiGLU, the attention heads and the Gated DeltaNet layers, with OlmoHybridConfig's
// defaults (linear heads = num_attention_heads, dk = int(0.75 hidden / heads), dv = 2 dk, conv 4,
// allow_neg_eigval true). Its init-only keys (linear_a_log_*, linear_dt_*) are not read.
void read_olmo_hybrid(const Obj& o, ModelConfig& c) {
  const std::string& ctx = o.ctx;
  c.intermediate_size = o.req_positive("intermediate_size");
  c.head_dim = o.positive("head_dim", c.hidden_size / c.num_attention_heads);
  check_heads(c, o, c.hidden_size, "hidden_size");
  c.linear_num_key_heads = o.positive("linear_num_key_heads", c.num_attention_heads);
  c.linear_num_value_heads = o.positive("linear_num_value_heads", c.num_attention_heads);
  OLMO_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0, ctx, ": linear_num_value_heads (",
             c.linear_num_value_heads, ") is not a multiple of linear_num_key_heads (",
             c.linear_num_key_heads, "): each key head must serve a whole group of value heads (GVA)");
  const auto dk = static_cast<int64_t>(
      std::floor(0.75 * static_cast<double>(c.hidden_size) / static_cast<double>(c.linear_num_key_heads)));
  c.linear_key_head_dim = o.positive("linear_key_head_dim", dk);
  c.linear_value_head_dim = o.positive("linear_value_head_dim", 2 * c.linear_key_head_dim);
  c.linear_conv_kernel_dim = o.positive("linear_conv_kernel_dim", 4);
  c.linear_allow_neg_eigval = o.boolean("linear_allow_neg_eigval", true);
  c.linear_norm_eps = 1e-5;  // the gated output norm's (FLA FusedRMSNormGated's), not rms_norm_eps
  bool linear = false, full = false;
  for (LayerType t : c.layer_types) (t == LayerType::LinearAttention ? linear : full) = true;
  OLMO_CHECK(linear && full, ctx,
             ": layer_types must hold at least one linear_attention and one full_attention layer (as "
             "OlmoHybridConfig requires)");
}

// olmo3moe: routed and shared experts, latent projection, dense layers, gating.
void read_moe(const Obj& o, ModelConfig& c) {
  const std::string& context = o.ctx;
  const json& j = o.j;
  c.n_routed_experts = o.positive("n_routed_experts", 64);
  c.num_experts_per_tok = o.positive("num_experts_per_tok", 4);
  OLMO_CHECK(c.num_experts_per_tok <= c.n_routed_experts, context, ": num_experts_per_tok (",
             c.num_experts_per_tok, ") exceeds n_routed_experts (", c.n_routed_experts, ")");
  c.original_num_experts_per_tok = o.opt_integer("original_num_experts_per_tok");
  if (c.original_num_experts_per_tok) {
    OLMO_CHECK(*c.original_num_experts_per_tok > 0, context,
               ": 'original_num_experts_per_tok' must be positive");
  }
  c.moe_intermediate_size = o.positive("moe_intermediate_size", 2048);
  c.latent_moe_dim = o.has("latent_moe_dim") ? o.positive("latent_moe_dim", 0) : 0;
  // HF: default 2048; an explicit null means "no shared expert".
  if (!j.contains("shared_expert_intermediate_size"))
    c.shared_expert_intermediate_size = 2048;
  else if (j.at("shared_expert_intermediate_size").is_null())
    c.shared_expert_intermediate_size = 0;
  else
    c.shared_expert_intermediate_size = o.positive("shared_expert_intermediate_size", 0);
  c.dense_mlp_intermediate_size = o.positive("dense_mlp_intermediate_size", 11008);
  c.latent_moe_bias = o.boolean("latent_moe_bias", false);
  OLMO_CHECK(!c.latent_moe_bias, context, ": key 'latent_moe_bias' = true is not supported");
  c.latent_moe_up_proj_input_norm = o.boolean("latent_moe_up_proj_input_norm", false);
  OLMO_CHECK(!c.latent_moe_up_proj_input_norm, context,
             ": key 'latent_moe_up_proj_input_norm' = true is not supported");
  c.gating_function = o.string("gating_function", "softmax");
  OLMO_CHECK(c.gating_function == "softmax" || c.gating_function == "sigmoid", context,
             ": key 'gating_function' must be \"softmax\" or \"sigmoid\", got '", c.gating_function, "'");
  c.normalize_expert_weights = o.number("normalize_expert_weights", 1.0);
  c.restore_weight_scale = o.boolean("restore_weight_scale", true);
  c.dense_layers_use_shared_expert = o.boolean("dense_layers_use_shared_expert", false);
  if (o.has("dense_layers_indices")) {
    const json& d = j.at("dense_layers_indices");
    OLMO_CHECK(d.is_array(), context, ": key 'dense_layers_indices' must be an array of layer indices");
    c.dense_layers_indices.clear();
    std::set<int64_t> seen;
    for (size_t i = 0; i < d.size(); ++i) {
      OLMO_CHECK(d[i].is_number_integer(), context, ": dense_layers_indices[", i, "] must be an integer");
      int64_t v = d[i].get<int64_t>();
      OLMO_CHECK(v >= 0 && v < c.num_hidden_layers, context, ": dense_layers_indices[", i, "] = ", v,
                 " is outside [0, ", c.num_hidden_layers, ")");
      OLMO_CHECK(seen.insert(v).second, context, ": dense_layers_indices lists layer ", v, " twice");
      c.dense_layers_indices.push_back(v);
    }
  }
}

// olmo3moe: embedding scale and norm, block layout, EMO routing.
void read_hybrid_block(const Obj& o, ModelConfig& c) {
  const std::string& context = o.ctx;
  c.embed_scale = o.number("embed_scale", 1.0);
  OLMO_CHECK(c.embed_scale > 0, context, ": key 'embed_scale' must be positive");
  c.embed_norm = o.boolean("embed_norm", false);
  c.use_peri_ln = o.boolean("use_peri_ln", false);
  OLMO_CHECK(
      c.use_peri_ln, context,
      ": key 'use_peri_ln' = false is not supported (only the peri-LN block of Olmo 3.5 has a verified "
      "tensor layout)");
  c.emo_min_document_expert_pool = o.opt_integer("emo_min_document_expert_pool");
  c.emo_max_document_expert_pool = o.opt_integer("emo_max_document_expert_pool");
  c.emo_eval_document_expert_pool = o.opt_integer("emo_eval_document_expert_pool");
  c.emo_eos_token_id = o.opt_integer("emo_eos_token_id");
  c.global_load_balancing = o.boolean("global_load_balancing", false);
  if (c.emo_min_document_expert_pool || c.emo_max_document_expert_pool) {
    OLMO_CHECK(c.emo_min_document_expert_pool && c.emo_max_document_expert_pool, context,
               ": emo_min_document_expert_pool and emo_max_document_expert_pool must be given together");
    int64_t lo = *c.emo_min_document_expert_pool, hi = *c.emo_max_document_expert_pool;
    OLMO_CHECK(lo >= c.num_experts_per_tok && lo <= hi && hi <= c.n_routed_experts, context,
               ": EMO pools must satisfy num_experts_per_tok <= emo_min_document_expert_pool <= "
               "emo_max_document_expert_pool <= n_routed_experts, got ",
               lo, ", ", hi);
  }
}

}  // namespace

RopeParams parse_rope_params(const json& rope, const std::string& context, double rope_theta,
                             int64_t max_position_embeddings) {
  return parse_rope(rope, context, rope_theta, max_position_embeddings);
}

ModelConfig parse_config(const json& j, const std::string& context) {
  OLMO_CHECK(j.is_object(), context, ": expected a JSON object");
  Obj o{j, context};
  ModelConfig c;
  c.original = j;
  o.require("model_type");
  c.model_type_name = o.string("model_type", "");
  std::string known;
  bool found = false;
  for (const ModelFamily& f : model_families()) {
    known += (known.empty() ? "" : " or ") + std::string(f.model_type);
    if (c.model_type_name == f.model_type) {
      c.model_type = f.type;
      found = true;
    }
  }
  OLMO_CHECK(found, context, ": unsupported model_type '", c.model_type_name, "' (expected ", known, ")");
  read_shared(o, c);
  read_token_ids(o, c);
  read_dtype(o, c);
  bool any_sliding = false;
  for (auto t : c.layer_types) any_sliding |= t == LayerType::SlidingAttention;
  if (any_sliding) {
    c.sliding_window = o.positive("sliding_window", 4096);
  } else {
    c.sliding_window = o.integer("sliding_window", 4096);
  }
  if (c.model_type == ModelType::OlmoHybrid && olmo_hybrid_nope(o))
    c.use_rope = false;
  else
    parse_rope_settings(c, o);
  if (c.model_type == ModelType::OlmoHybrid) {
    read_olmo_hybrid(o, c);
    return c;
  }
  if (!c.is_moe()) {
    c.intermediate_size = o.req_positive("intermediate_size");
    c.head_dim = o.positive("head_dim", c.hidden_size / c.num_attention_heads);
    check_heads(c, o, c.hidden_size, "hidden_size");
    return c;
  }
  read_hybrid_attention(o, c);
  read_kda(o, c);
  read_moe(o, c);
  read_hybrid_block(o, c);
  return c;
}

ModelConfig load_config(const std::string& path) {
  return parse_config(io::parse_json(io::read_file(path), path), path);
}

json config_to_json(const ModelConfig& c, std::optional<DType> export_dtype) {
  json j = c.original;
  if (export_dtype) {
    j["torch_dtype"] = torch_dtype_name(*export_dtype);
    if (j.contains("dtype")) j["dtype"] = torch_dtype_name(*export_dtype);
  }
  return j;
}

void save_config(const ModelConfig& c, const std::string& path, std::optional<DType> export_dtype) {
  io::write_file_atomic(path, config_to_json(c, export_dtype).dump(2) + "\n");
}

std::string config_summary(const ModelConfig& c) {
  std::ostringstream os;
  os << "model_type          " << c.model_type_name << "\n"
     << "vocab_size          " << c.vocab_size << "\n"
     << "hidden_size         " << c.hidden_size << "\n"
     << "num_hidden_layers   " << c.num_hidden_layers << "\n"
     << "attention heads     " << c.num_attention_heads << " (kv " << c.num_key_value_heads << ", head_dim "
     << c.head_dim << ")\n";
  int counts[3] = {0, 0, 0};
  for (auto t : c.layer_types) counts[static_cast<int>(t)]++;
  os << "layer types         ";
  for (int t = 0; t < 3; ++t) {
    if (counts[t]) os << counts[t] << " " << layer_type_name(static_cast<LayerType>(t)) << "  ";
  }
  os << "\n";
  if (c.model_type == ModelType::OlmoHybrid) {
    os << "intermediate_size   " << c.intermediate_size << "\n"
       << "GDN                 key heads " << c.linear_num_key_heads << ", value heads "
       << c.linear_num_value_heads << ", dk " << c.linear_key_head_dim << ", dv " << c.linear_value_head_dim
       << ", conv " << c.linear_conv_kernel_dim << ", allow_neg_eigval "
       << (c.linear_allow_neg_eigval ? "true" : "false") << "\n"
       << "rope (full)         ";
    if (c.use_rope)
      os << c.rope_full.rope_type << ", theta " << c.rope_full.rope_theta << "\n";
    else
      os << "none (NoPE: rope_theta null)\n";
  } else if (!c.is_moe()) {
    os << "intermediate_size   " << c.intermediate_size << "\n"
       << "sliding_window      " << c.sliding_window << "\n"
       << "rope (full)         " << c.rope_full.rope_type << ", theta " << c.rope_full.rope_theta;
    if (c.rope_full.rope_type == "yarn") {
      os << ", factor " << c.rope_full.factor << ", original " << c.rope_full.original_max_position_embeddings
         << ", attention_factor " << c.rope_full.attention_factor;
    }
    os << "\nrope (sliding)      " << c.rope_sliding.rope_type << ", theta " << c.rope_sliding.rope_theta
       << "\n";
  } else {
    os << "KDA                 heads " << c.linear_num_key_heads << ", dk " << c.linear_key_head_dim
       << ", dv " << c.linear_value_head_dim << ", conv " << c.linear_conv_kernel_dim << "\n"
       << "MoE                 " << c.n_routed_experts << " experts, top-" << c.num_experts_per_tok
       << ", expert hidden " << c.moe_intermediate_size << ", latent " << c.latent_moe_dim << ", shared "
       << c.shared_expert_intermediate_size << ", dense " << c.dense_mlp_intermediate_size << "\n"
       << "embed_scale         " << c.embed_scale << (c.embed_norm ? " (+ embed norm)" : "") << "\n"
       << "use_rope            " << (c.use_rope ? "true" : "false") << "\n";
  }
  os << "special tokens      eos";
  for (auto e : c.eos_token_ids) os << " " << e;
  os << (c.eos_token_ids.empty() ? " -" : "") << ", pad "
     << (c.pad_token_id ? std::to_string(*c.pad_token_id) : "-") << ", bos "
     << (c.bos_token_id ? std::to_string(*c.bos_token_id) : "-") << "\n";
  os << "rms_norm_eps        " << c.rms_norm_eps << "\n"
     << "tie_word_embeddings " << (c.tie_word_embeddings ? "true" : "false") << "\n";
  return os.str();
}

}  // namespace olmosft::model
