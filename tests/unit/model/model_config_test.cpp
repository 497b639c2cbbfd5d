// model: config.json parsing/validation/round trip and the parameter registry (counts from
// docs/reference/architecture.md A.5, B.8, D.1, D.2).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "io/atomic_file.h"
#include "model/config.h"
#include "model/params.h"

using namespace olmosft;
using namespace olmosft::model;
using json = nlohmann::json;

namespace {

ModelConfig cfg(const json& j) { return parse_config(j, "config.json"); }

void expect_error(const json& j, std::vector<std::string> fragments) {
  try {
    cfg(j);
    FAIL() << "expected an error for " << j.dump().substr(0, 200);
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("config.json"), std::string::npos) << m;
    for (const auto& f : fragments)
      EXPECT_NE(m.find(f), std::string::npos) << "missing '" << f << "' in: " << m;
  }
}

const ParamSpec& find(const std::vector<ParamSpec>& reg, const std::string& name) {
  for (const auto& p : reg) {
    if (p.name == name) return p;
  }
  throw std::runtime_error("no param " + name);
}

}  // namespace

TEST(ParamRegistry, DocumentedCounts) {
  struct Case {
    std::string preset;
    int64_t total, active;
    size_t tensors;
  };
  // docs/reference/architecture.md: A.5 (7B), D.1 tiny, B.8 (Olmo 3.5 small at vocab 100278), D.2 tiny and
  // small.
  std::vector<Case> cases = {{"olmo3-7b", 7298011136, 7298011136, 355},
                             {"olmo3-tiny", 362304, 362304, 91},
                             {"olmo3moe-small", 12496190080, 794081920, 23441},
                             {"olmo3moe-tiny", 1134064, 617968, 537},
                             {"olmo3moe-d2small", 110644800, 28069440, 3281}};
  for (const auto& k : cases) {
    auto c = cfg(preset_config_json(k.preset));
    auto pc = count_params(c);
    EXPECT_EQ(pc.total, k.total) << k.preset;
    EXPECT_EQ(pc.active, k.active) << k.preset;
    EXPECT_EQ(pc.tensors, k.tensors) << k.preset;
  }
  // B.8 at the native vocabulary 100352: 12,496,341,632 total, 794,233,472 active.
  json j = preset_config_json("olmo3moe-small");
  j["vocab_size"] = 100352;
  auto pc = count_params(cfg(j));
  EXPECT_EQ(pc.total, 12496341632);
  EXPECT_EQ(pc.active, 794233472);
  // A.5: Olmo 3 32B = 32,233,522,176 (GQA, k/v [1024, 5120]).
  json b = preset_config_json("olmo3-7b");
  b["hidden_size"] = 5120;
  b["num_hidden_layers"] = 64;
  b["num_attention_heads"] = 40;
  b["num_key_value_heads"] = 8;
  b["intermediate_size"] = 27648;
  b.erase("layer_types");  // HF default pattern (every 4th layer full)
  auto c32 = cfg(b);
  EXPECT_EQ(count_params(c32).total, 32233522176);
  auto reg32 = param_registry(c32);
  EXPECT_EQ(find(reg32, "model.layers.5.self_attn.k_proj.weight").shape, (Shape{1024, 5120}));
  EXPECT_EQ(find(reg32, "model.layers.5.self_attn.k_norm.weight").shape, (Shape{1024}));
  // Per-layer figure of A.5: 202,391,552 per 7B layer.
  auto c7 = cfg(preset_config_json("olmo3-7b"));
  int64_t layer3 = 0;
  for (const auto& p : param_registry(c7)) {
    if (p.layer == 3) layer3 += shape_numel(p.shape);
  }
  EXPECT_EQ(layer3, 202391552);
}

TEST(ParamRegistry, NamesAndShapes) {
  auto c = cfg(preset_config_json("olmo3moe-small"));
  auto reg = param_registry(c);
  std::set<std::string> names;
  for (const auto& p : reg) EXPECT_TRUE(names.insert(p.name).second) << p.name;
  EXPECT_EQ(reg.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(reg[1].name, "model.embed_norm.weight");
  EXPECT_EQ(reg.back().name, "lm_head.weight");
  EXPECT_EQ(find(reg, "model.layers.0.self_attn.v_conv1d.weight").shape, (Shape{2048, 1, 4}));
  EXPECT_EQ(find(reg, "model.layers.0.self_attn.f_proj_2.weight").shape, (Shape{1024, 256}));
  EXPECT_EQ(find(reg, "model.layers.0.self_attn.g_proj_2.weight").shape, (Shape{2048, 256}));
  EXPECT_EQ(find(reg, "model.layers.0.self_attn.dt_bias").shape, (Shape{1024}));
  EXPECT_TRUE(find(reg, "model.layers.0.self_attn.A_log").fp32_master_only);
  EXPECT_EQ(find(reg, "model.layers.0.mlp.gate_proj.weight").shape, (Shape{8192, 1024}));
  EXPECT_EQ(find(reg, "model.layers.7.self_attn.q_norm.weight").shape, (Shape{8, 128}));
  EXPECT_EQ(find(reg, "model.layers.7.self_attn.k_proj.weight").shape, (Shape{512, 1024}));
  EXPECT_EQ(find(reg, "model.layers.7.self_attn.ssmax_scale").shape, (Shape{8}));
  EXPECT_EQ(find(reg, "model.layers.15.self_attn.g_proj.weight").shape, (Shape{1024, 1024}));
  EXPECT_EQ(find(reg, "model.layers.1.mlp.experts.511.down_proj.weight").shape, (Shape{512, 1024}));
  EXPECT_TRUE(find(reg, "model.layers.1.mlp.experts.511.down_proj.weight").routed_expert);
  EXPECT_EQ(find(reg, "model.layers.1.mlp.latent_up_proj.weight").shape, (Shape{1024, 512}));
  EXPECT_EQ(find(reg, "model.layers.1.mlp.shared_expert.down_proj.weight").shape, (Shape{1024, 1024}));
  EXPECT_EQ(find(reg, "model.layers.1.mlp.router.gate.weight").shape, (Shape{512, 1024}));
  EXPECT_THROW(find(reg, "model.layers.7.self_attn.A_log"), std::runtime_error);

  auto t = cfg(preset_config_json("olmo3-tiny"));
  auto rt = param_registry(t);
  EXPECT_EQ(rt[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(find(rt, "model.layers.0.self_attn.k_proj.weight").shape, (Shape{32, 64}));
  // Tied embeddings drop lm_head.
  json j = preset_config_json("olmo3-tiny");
  j["tie_word_embeddings"] = true;
  EXPECT_EQ(count_params(cfg(j)).tensors, 90u);
}

// The registry order is the HF state-dict order and also the export and ZeRO-3 sharding order: pinned, per
// preset and per variant of the optional tensors, by a hash (FNV-1a 64) of every row (name, shape, layer,
// routed, fp32, decay) in order, recorded from the per-family builders the units' declarations replaced.
TEST(ParamRegistry, OrderIsPinnedForEveryPreset) {
  auto fingerprint = [](const std::vector<ParamSpec>& reg) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const std::string& s) {
      for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    };
    for (const auto& p : reg) {
      std::string row = p.name + "|";
      for (int64_t x : p.shape) row += std::to_string(x) + ",";
      row += "|" + std::to_string(p.layer) + (p.routed_expert ? "R" : "-") +
             (p.fp32_master_only ? "F" : "-") + (p.decay ? "D" : "-") + "\n";
      mix(row);
    }
    return h;
  };
  std::vector<std::pair<std::string, json>> configs;
  for (const auto& n : preset_names()) configs.emplace_back(n, preset_config_json(n));
  json j = preset_config_json("olmo3-tiny");
  j["tie_word_embeddings"] = true;
  configs.emplace_back("olmo3-tiny tied", j);
  // the hybrid without the attention gate, SSMax, per-head gains, latent projection, shared expert and embed
  // norm, with two dense layers
  j = preset_config_json("olmo3moe-tiny");
  for (const char* k : {"use_head_qk_norm", "qk_norm_per_head_gains", "scalable_softmax", "embed_norm"})
    j[k] = false;
  j.erase("attention_gate_type");
  j["latent_moe_dim"] = nullptr;
  j["shared_expert_intermediate_size"] = nullptr;
  j["dense_layers_indices"] = json::array({0, 3});
  configs.emplace_back("olmo3moe-tiny plain", j);
  j = preset_config_json("olmo-hybrid-tiny");  // GVA: two value heads per key head
  j["linear_num_key_heads"] = 1;
  configs.emplace_back("olmo-hybrid-tiny gva", j);
  const std::map<std::string, std::pair<size_t, uint64_t>> pinned = {
      {"olmo3-7b", {355, 0x96c702fc4afef95bull}},
      {"olmo3-tiny", {91, 0x42726179aa6472e0ull}},
      {"olmo3-small", {91, 0x01105484f6b49f3bull}},
      {"olmo3moe-small", {23441, 0xd0be444452d5dbf9ull}},
      {"olmo3moe-tiny", {537, 0xac02e97c0de40efbull}},
      {"olmo3moe-d2small", {3281, 0x78d6e755c3be4e49ull}},
      {"olmo-hybrid-7b", {475, 0x29754e44e0c1c079ull}},
      {"olmo-hybrid-tiny", {121, 0x1ba6cfe1eb88e374ull}},
      {"olmo3-tiny tied", {90, 0x18980b1f2e6d5408ull}},
      {"olmo3moe-tiny plain", {453, 0x87c7c71270aeb866ull}},
      {"olmo-hybrid-tiny gva", {121, 0x28a0f5e8fb6c1310ull}},
  };
  for (const auto& [name, cj] : configs) {
    const auto reg = param_registry(cfg(cj));
    char row[160];  // the pinned form, to re-record after a deliberate change of the registry
    std::snprintf(row, sizeof row, "{\"%s\", {%zu, 0x%016llxull}}", name.c_str(), reg.size(),
                  static_cast<unsigned long long>(fingerprint(reg)));
    auto it = pinned.find(name);
    if (it == pinned.end()) {
      ADD_FAILURE() << "no pinned fingerprint: " << row;
      continue;
    }
    EXPECT_EQ(reg.size(), it->second.first) << row;
    EXPECT_EQ(fingerprint(reg), it->second.second) << row;
  }
}

TEST(ModelConfig, Olmo3Fields) {
  auto c = cfg(preset_config_json("olmo3-7b"));
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  ASSERT_EQ(c.layer_types.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(c.layer_types[i], (i + 1) % 4 == 0 ? LayerType::FullAttention : LayerType::SlidingAttention)
        << i;
  }
  EXPECT_EQ(c.rope_full.rope_type, "yarn");
  EXPECT_EQ(c.rope_full.factor, 8.0);
  EXPECT_EQ(c.rope_full.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_full.attention_factor, 1.2079441541679836);
  EXPECT_EQ(c.rope_sliding.rope_type, "default");
  EXPECT_EQ(c.rope_sliding.rope_theta, 500000.0);
  EXPECT_EQ(&c.rope_for(3), &c.rope_full);
  EXPECT_EQ(&c.rope_for(2), &c.rope_sliding);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{100257}));
  EXPECT_EQ(c.pad_token_id, 100277);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_EQ(c.torch_dtype, DType::BF16);
  json multi = preset_config_json("olmo3-7b");
  multi["eos_token_id"] = {100257, 100265};
  multi["dtype"] = "bfloat16";
  EXPECT_EQ(cfg(multi).eos_token_ids, (std::vector<int64_t>{100257, 100265}));
  multi["dtype"] = "float32";
  expect_error(multi, {"'torch_dtype' and 'dtype' disagree"});
  // attention_factor default = 0.1 ln(factor) + 1 (HF get_mscale) — the published value is exactly that.
  json j = preset_config_json("olmo3-7b");
  j["rope_scaling"].erase("attention_factor");
  EXPECT_NEAR(cfg(j).rope_full.attention_factor, 1.2079441541679836, 1e-15);
}

TEST(ModelConfig, HfDefaults) {
  json j = {{"model_type", "olmo3"},   {"vocab_size", 100},      {"hidden_size", 32},
            {"intermediate_size", 64}, {"num_hidden_layers", 4}, {"num_attention_heads", 4}};
  auto c = cfg(j);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.rope_full.rope_type, "default");
  EXPECT_EQ(c.rope_full.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.layer_types[3], LayerType::FullAttention);
  EXPECT_EQ(c.layer_types[2], LayerType::SlidingAttention);
  j["num_key_value_heads"] = nullptr;  // null = default, as HF
  EXPECT_EQ(cfg(j).num_key_value_heads, 4);
}

TEST(ModelConfig, RopeParametersForm) {
  json legacy = preset_config_json("olmo3-tiny");
  json modern = legacy;
  modern.erase("rope_scaling");
  modern.erase("rope_theta");
  modern["rope_parameters"] = {{"full_attention",
                                {{"rope_type", "yarn"},
                                 {"rope_theta", 500000},
                                 {"factor", 8.0},
                                 {"original_max_position_embeddings", 64},
                                 {"beta_fast", 32.0},
                                 {"beta_slow", 1.0},
                                 {"attention_factor", 1.2079441541679836}}},
                               {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 500000}}}};
  auto a = cfg(legacy), b = cfg(modern);
  EXPECT_EQ(a.rope_full, b.rope_full);
  EXPECT_EQ(a.rope_sliding, b.rope_sliding);
  // Flat form applies to every layer type.
  json flat = legacy;
  flat.erase("rope_scaling");
  flat["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  auto f = cfg(flat);
  EXPECT_EQ(f.rope_full.rope_theta, 1234.0);
  EXPECT_EQ(f.rope_sliding.rope_theta, 1234.0);
  // Both forms given and disagreeing.
  json both = modern;
  both["rope_scaling"] = legacy["rope_scaling"];
  both["rope_scaling"]["beta_fast"] = 16.0;
  expect_error(both, {"rope_scaling", "rope_parameters", "disagree"});
  json bad = modern;
  bad["rope_parameters"]["chunked_attention"] = json::object();
  expect_error(bad, {"rope_parameters", "chunked_attention"});
}

TEST(ModelConfig, ClearErrors) {
  json base = preset_config_json("olmo3-tiny");
  auto with = [&](const std::string& k, json v) {
    json j = base;
    j[k] = v;
    return j;
  };
  auto without = [&](const std::string& k) {
    json j = base;
    j.erase(k);
    return j;
  };
  expect_error(with("model_type", "llama"), {"unsupported model_type 'llama'"});
  expect_error(without("model_type"), {"'model_type'"});
  expect_error(without("hidden_size"), {"missing required key 'hidden_size'"});
  expect_error(without("intermediate_size"), {"'intermediate_size'"});
  expect_error(with("hidden_size", "64"), {"'hidden_size'", "integer"});
  expect_error(with("hidden_size", 0), {"'hidden_size'", "positive"});
  json h6 = with("num_attention_heads", 6);
  expect_error(h6, {"num_attention_heads (6) must divide hidden_size (64)"});
  expect_error(with("num_key_value_heads", 3),
               {"num_key_value_heads (3) must divide num_attention_heads (4)"});
  expect_error(with("layer_types", json::array({"full_attention"})), {"'layer_types' has 1 entries", "8"});
  json lt = base["layer_types"];
  lt[2] = "linear_attention";
  expect_error(with("layer_types", lt), {"layer_types[2]", "linear_attention"});
  expect_error(with("hidden_act", "gelu"), {"'hidden_act'", "gelu"});
  expect_error(with("attention_bias", true), {"'attention_bias'"});
  expect_error(with("tie_word_embeddings", 1), {"'tie_word_embeddings'", "true or false"});
  expect_error(with("rms_norm_eps", -1.0), {"'rms_norm_eps'"});
  // Issue #17: a null number is not silently the default (sliding_window null became 4096, rms_norm_eps null
  // 1e-5); a null token id still means "none", as in transformers, and a null inside rope_scaling is its
  // default.
  expect_error(with("sliding_window", nullptr), {"'sliding_window' is null", "remove the key"});
  expect_error(with("rms_norm_eps", nullptr), {"'rms_norm_eps' is null"});
  expect_error(with("tie_word_embeddings", nullptr), {"'tie_word_embeddings' is null"});
  EXPECT_FALSE(parse_config(with("pad_token_id", nullptr), "c.json").pad_token_id.has_value());
  expect_error(with("eos_token_id", 100257), {"'eos_token_id' = 100257", "outside the vocabulary [0, 512)"});
  expect_error(with("eos_token_id", json::array({1, -1})), {"'eos_token_id' = -1"});
  expect_error(with("pad_token_id", "x"), {"'pad_token_id'", "integer"});
  expect_error(with("torch_dtype", "int8"), {"'torch_dtype'", "int8"});
  json rs = base["rope_scaling"];
  rs["rope_type"] = "longrope";
  expect_error(with("rope_scaling", rs), {"rope_scaling", "rope_type 'longrope'"});
  rs = base["rope_scaling"];
  rs["factor"] = 4.0;
  expect_error(with("rope_scaling", rs), {"rope_scaling", "'factor' 4", "inconsistent", "512 / 64"});
  rs = base["rope_scaling"];
  rs.erase("factor");
  expect_error(with("rope_scaling", rs), {"rope_scaling", "missing required key 'factor'"});
  rs = base["rope_scaling"];
  rs["beta_slow"] = 64.0;
  expect_error(with("rope_scaling", rs), {"'beta_fast'", "'beta_slow'"});
  rs = base["rope_scaling"];
  rs["foo"] = 1;
  expect_error(with("rope_scaling", rs), {"rope_scaling", "unknown key 'foo'"});

  json m = preset_config_json("olmo3moe-tiny");
  auto mwith = [&](const std::string& k, json v) {
    json j = m;
    j[k] = v;
    return j;
  };
  json mno = m;
  mno.erase("linear_num_key_heads");
  expect_error(mno, {"missing required key 'linear_num_key_heads'"});
  expect_error(mwith("num_experts_per_tok", 32), {"num_experts_per_tok (32) exceeds n_routed_experts (16)"});
  expect_error(mwith("dense_layers_indices", json::array({9})), {"dense_layers_indices[0] = 9"});
  expect_error(mwith("attention_gate_type", "headwise"), {"'attention_gate_type'", "headwise"});
  expect_error(mwith("linear_num_value_heads", 4), {"linear_num_value_heads (4)"});
  expect_error(mwith("use_peri_ln", false), {"'use_peri_ln'"});
  expect_error(mwith("gating_function", "relu"), {"'gating_function'"});
  expect_error(mwith("emo_min_document_expert_pool", 2), {"emo_min_document_expert_pool"});
  json lt2 = m["layer_types"];
  lt2[0] = "mamba";
  expect_error(mwith("layer_types", lt2), {"layer_types[0]", "mamba"});
}

TEST(ModelConfig, WriteBackPreservesTheOriginal) {
  for (const auto& name : preset_names()) {
    json j = preset_config_json(name);
    j["some_future_key"] = {{"nested", {1, 2, 3}}};  // unknown keys survive
    auto c = cfg(j);
    EXPECT_EQ(config_to_json(c), j) << name;
    json changed = config_to_json(c, DType::F32);
    EXPECT_EQ(changed["torch_dtype"], "float32");
    changed["torch_dtype"] = j["torch_dtype"];
    EXPECT_EQ(changed, j) << name;  // nothing else changed
  }
  auto dir = std::filesystem::temp_directory_path() / ("olmosft-cfg-" + io::random_suffix());
  std::filesystem::create_directories(dir);
  auto c = cfg(preset_config_json("olmo3moe-tiny"));
  save_config(c, (dir / "config.json").string());
  auto back = load_config((dir / "config.json").string());
  EXPECT_EQ(back.original, c.original);
  EXPECT_EQ(count_params(back).total, 1134064);
  io::write_file_atomic((dir / "bad.json").string(), "{\"model_type\": ");
  try {
    load_config((dir / "bad.json").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json: not valid JSON"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(ModelConfig, SummaryMentionsTheShape) {
  auto s = config_summary(cfg(preset_config_json("olmo3moe-small")));
  EXPECT_NE(s.find("olmo3moe"), std::string::npos);
  EXPECT_NE(s.find("512 experts, top-16"), std::string::npos);
  EXPECT_NE(s.find("14 linear_attention"), std::string::npos);
}

// hf::layer_of is how dist::model_specs groups tensors into per-layer units (ZeRO-3 gathering): every block
// tensor of the registry maps to its layer, everything else to -1, and look-alike names are not blocks.
TEST(ModelParams, LayerOfNames) {
  EXPECT_EQ(hf::layer_of("model.layers.0.self_attn.q_proj.weight"), 0);
  EXPECT_EQ(hf::layer_of("model.layers.31.mlp.experts.7.up_proj.weight"), 31);
  EXPECT_EQ(hf::layer_of("model.embed_tokens.weight"), -1);
  EXPECT_EQ(hf::layer_of("lm_head.weight"), -1);
  EXPECT_EQ(hf::layer_of("model.layers."), -1);
  EXPECT_EQ(hf::layer_of("model.layers.x.mlp"), -1);
  EXPECT_EQ(hf::layer_of("model.layers.12"), -1);
  for (const char* preset : {"olmo3-tiny", "olmo3moe-tiny"}) {
    const ModelConfig c = parse_config(preset_config_json(preset), preset);
    for (const auto& s : param_registry(c)) EXPECT_EQ(hf::layer_of(s.name), s.layer) << s.name;
  }
}
