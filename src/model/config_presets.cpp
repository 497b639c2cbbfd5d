// config.json objects for the reference configurations of docs/reference/architecture.md (A.1, B.1, D.1,
// D.2).
#include <cmath>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json.h"
#include "model/config.h"

namespace olmosft::model {

using json = nlohmann::json;

namespace {

json olmo3_layer_types(int layers) {
  json a = json::array();
  for (int i = 0; i < layers; ++i) a.push_back((i + 1) % 4 != 0 ? "sliding_attention" : "full_attention");
  return a;
}

// The keys every preset writes alike: the architecture, the sizes every family has, the activation, norms'
// eps, no attention bias or dropout, untied embeddings, dolma2's token ids, init and dtype.
json base(const char* arch, const char* type, int64_t vocab, int64_t hidden, int64_t layers, int64_t heads,
          int64_t kv, int64_t max_pos) {
  return json{
      {"architectures", {arch}},      {"model_type", type},          {"vocab_size", vocab},
      {"hidden_size", hidden},        {"num_hidden_layers", layers}, {"num_attention_heads", heads},
      {"num_key_value_heads", kv},    {"hidden_act", "silu"},        {"rms_norm_eps", 1e-6},
      {"attention_bias", false},      {"attention_dropout", 0.0},    {"max_position_embeddings", max_pos},
      {"tie_word_embeddings", false}, {"eos_token_id", 100257},      {"pad_token_id", 100277},
      {"bos_token_id", nullptr},      {"initializer_range", 0.02},   {"torch_dtype", "bfloat16"}};
}

json olmo3(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t inter,
           int64_t window, int64_t max_pos, int64_t orig) {
  json j = base("Olmo3ForCausalLM", "olmo3", vocab, hidden, layers, heads, kv, max_pos);
  j.update(json{{"intermediate_size", inter},
                {"rope_theta", 500000},
                {"rope_scaling",
                 {{"rope_type", "yarn"},
                  {"factor", 8.0},
                  {"original_max_position_embeddings", orig},
                  {"beta_fast", 32.0},
                  {"beta_slow", 1.0},
                  {"attention_factor", 1.2079441541679836}}},
                {"sliding_window", window},
                {"layer_types", olmo3_layer_types(static_cast<int>(layers))}});
  return j;
}

struct MoeDims {
  int64_t vocab, hidden, layers_per_group, groups, heads, kv, head_dim, kda_heads, dk, dv, experts, topk,
      expert_h, latent, shared, dense, max_pos;
};

json olmo3moe(const MoeDims& d) {
  json lt = json::array();
  for (int64_t g = 0; g < d.groups; ++g) {
    for (int64_t i = 0; i + 1 < d.layers_per_group; ++i) lt.push_back("linear_attention");
    lt.push_back("full_attention");
  }
  json j = base("Olmo3MoeForCausalLM", "olmo3moe", d.vocab, d.hidden, d.groups * d.layers_per_group, d.heads,
                d.kv, d.max_pos);
  j.update(json{{"layer_types", lt},
                {"dense_layers_indices", {0}},
                {"head_dim", d.head_dim},
                {"attention_hidden_size", d.heads * d.head_dim},
                {"use_rope", false},
                {"use_head_qk_norm", true},
                {"qk_norm_per_head_gains", true},
                {"scalable_softmax", true},
                {"attention_gate_type", "elementwise"},
                {"attention_gate_full_precision", true},
                {"linear_num_key_heads", d.kda_heads},
                {"linear_num_value_heads", d.kda_heads},
                {"linear_key_head_dim", d.dk},
                {"linear_value_head_dim", d.dv},
                {"linear_conv_kernel_dim", 4},
                {"linear_allow_neg_eigval", true},
                {"linear_norm_eps", 1e-5},
                {"n_routed_experts", d.experts},
                {"num_experts_per_tok", d.topk},
                {"moe_intermediate_size", d.expert_h},
                {"latent_moe_dim", d.latent},
                {"latent_moe_bias", false},
                {"latent_moe_up_proj_input_norm", false},
                {"shared_expert_intermediate_size", d.shared},
                {"dense_mlp_intermediate_size", d.dense},
                {"dense_layers_use_shared_expert", true},
                {"gating_function", "softmax"},
                {"normalize_expert_weights", 1.0},
                {"restore_weight_scale", true},
                {"original_num_experts_per_tok", nullptr},
                {"use_peri_ln", true},
                {"embed_scale", std::sqrt(static_cast<double>(d.hidden))},
                {"embed_norm", true},
                {"sliding_window", d.max_pos},
                {"rope_theta", 10000}});
  return j;
}

// Olmo Hybrid (HF olmo_hybrid; docs/olmo_hybrid.md): OlmoHybridConfig's keys as save_pretrained writes
// them; layer_types linear x3 then full, repeated. nope: rope_parameters {rope_theta: null}, as released.
json olmo_hybrid(int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv,
                 int64_t lheads, int64_t dk, int64_t dv, int64_t max_pos, bool nope) {
  json types = json::array();
  for (int64_t i = 0; i < layers; ++i) types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
  json j = base("OlmoHybridForCausalLM", "olmo_hybrid", vocab, hidden, layers, heads, kv, max_pos);
  j.update(json{
      {"intermediate_size", inter},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", nope ? json(nullptr) : json(10000.0)}}},
      {"layer_types", types},
      {"linear_num_key_heads", lheads},
      {"linear_num_value_heads", lheads},
      {"linear_key_head_dim", dk},
      {"linear_value_head_dim", dv},
      {"linear_conv_kernel_dim", 4},
      {"linear_allow_neg_eigval", true}});
  return j;
}

// Test vocabularies are far smaller than dolma2's: eos / pad become the last two ids (the real ones,
// 100257 / 100277, would lie outside the vocabulary).
json small_vocab_ids(json j) {
  int64_t v = j["vocab_size"].get<int64_t>();
  j["eos_token_id"] = v - 2;
  j["pad_token_id"] = v - 1;
  return j;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"olmo3-7b",      "olmo3-tiny",       "olmo3-small",    "olmo3moe-small",
          "olmo3moe-tiny", "olmo3moe-d2small", "olmo-hybrid-7b", "olmo-hybrid-tiny"};
}

json preset_config_json(const std::string& name) {
  if (name == "olmo3-7b") return olmo3(100278, 4096, 32, 32, 32, 11008, 4096, 65536, 8192);
  if (name == "olmo3-tiny") return small_vocab_ids(olmo3(512, 64, 8, 4, 2, 128, 16, 512, 64));
  if (name == "olmo3-small") return small_vocab_ids(olmo3(4096, 256, 8, 8, 4, 704, 64, 2048, 256));
  if (name == "olmo3moe-small")
    return olmo3moe({100278, 1024, 8, 2, 8, 4, 128, 8, 128, 256, 512, 16, 1024, 512, 1024, 8192, 65536});
  if (name == "olmo3moe-tiny") {
    json j = olmo3moe({512, 64, 8, 1, 2, 1, 32, 2, 16, 32, 16, 4, 64, 32, 64, 512, 512});
    j["embed_scale"] = 8.0;
    return small_vocab_ids(j);
  }
  if (name == "olmo3moe-d2small")
    return small_vocab_ids(
        olmo3moe({4096, 256, 8, 2, 4, 2, 64, 4, 64, 128, 64, 8, 256, 128, 256, 2048, 2048}));
  if (name == "olmo-hybrid-7b") return olmo_hybrid(100352, 3840, 11008, 32, 30, 30, 30, 96, 192, 65536, true);
  if (name == "olmo-hybrid-tiny")
    return small_vocab_ids(olmo_hybrid(512, 64, 128, 8, 4, 2, 2, 16, 32, 512, false));
  std::string all;
  for (const auto& n : preset_names()) all += (all.empty() ? "" : ", ") + n;
  fail("unknown model preset '", name, "' (expected one of ", all, ")");
}

ModelConfig config_from_path_or_preset(const std::string& config, int64_t keep_layers,
                                       const std::string& layers_flag) {
  const bool is_path = config.find('/') != std::string::npos || config.ends_with(".json");
  nlohmann::json j = is_path ? io::parse_json(io::read_file(config), config) : preset_config_json(config);
  if (keep_layers > 0) {
    const int64_t have = j.value("num_hidden_layers", int64_t{0});
    OLMO_CHECK(keep_layers <= have, layers_flag, " ", keep_layers, ": ", config, " has ", have, " layers");
    j["num_hidden_layers"] = keep_layers;
    if (j.contains("layer_types") && j["layer_types"].is_array())
      j["layer_types"].erase(j["layer_types"].begin() + keep_layers, j["layer_types"].end());
  }
  return parse_config(j, is_path ? config : "preset " + config);
}

}  // namespace olmosft::model
