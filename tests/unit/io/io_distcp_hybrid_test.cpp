// The OLMo-core import of the Olmo 3.5 hybrid (olmo3moe: KDA, NoPE/SSMax/gated attention, latent MoE,
// peri-LN) on checkpoints written by OLMo-core 3.0.0's own code (tests/golden/distcp/hybrid_*, made by
// tests/reference/olmo_core_hybrid_distcp.py): save_model_and_optim_state ("model.<name>", shaped) and the
// hybrid trainer's OLMoDDPTrainModule.save_state_dict_direct ("module.<name>.main", flat float32 masters
// split over 2 ranks). Every tensor read equals the writer's; the config equals OLMo-core's own HF export's;
// every HF tensor equals OLMo-core's own convert_olmo3moe_state_to_hf (sha256); wrong shapes, missing and
// unexpected tensors and unsupported settings are refused naming the tensor or key.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io/atomic_file.h"
#include "io/distcp.h"
#include "io/hash.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/hf_dir.h"
#include "model/model.h"
#include "model/olmo_core.h"

namespace fs = std::filesystem;
using namespace olmosft;

namespace {

const std::string kGolden = std::string(OLMOSFT_GOLDEN_DIR) + "/distcp";
const std::string k1 = kGolden + "/hybrid_1proc", kDirect = kGolden + "/hybrid_direct_2proc";

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() / ("olmosft-distcp-hybrid-" + io::random_suffix())).string();
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return path + "/" + n; }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The fixture's config.json with `edit` applied to its "model" object, written to DIR/NAME.
std::string edited_config(const TempDir& t, const std::string& name,
                          const std::function<void(nlohmann::json&)>& edit) {
  auto j = io::parse_json(io::read_file(k1 + "/config.json"), "config");
  edit(j["model"]);
  io::write_file_atomic(t / name, j.dump());
  return t / name;
}

}  // namespace

// Every parameter OLMo-core held when it saved, read back byte for byte: shaped (1 process) or flat .main
// masters reassembled from both ranks' files (2 processes).
TEST(OlmoCoreHybrid, EveryParameterEqualsTheWriters) {
  for (const auto& [dir, name, key_fmt] :
       {std::tuple{k1, std::string("1proc"), 0}, std::tuple{kDirect, std::string("2proc"), 1}}) {
    auto ck = distcp::Checkpoint::open(dir + "/model_and_optim");
    auto ref = safetensors::Reader::open(kGolden + "/oracle/tensors_hybrid_" + name + ".safetensors");
    size_t n = 0, split = 0;
    for (const auto& t : ref->tensors()) {
      const std::string key = key_fmt == 0 ? "model." + t.name : "module." + t.name + ".main";
      Tensor got = ck.read(key);
      Tensor want = ref->view(t.name);
      ASSERT_EQ(got.dtype(), DType::F32) << key;
      ASSERT_EQ(got.numel(), want.numel()) << key;
      EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << key;
      if (key_fmt == 1) {
        EXPECT_EQ(got.shape(), (Shape{want.numel()})) << key << " is stored flat";
      }
      split += ck.at(key).chunks.size() > 1;
      ++n;
    }
    EXPECT_EQ(n, 99u) << name;
    if (key_fmt == 1) {
      EXPECT_GE(split, 5u) << "tensors of >= 4096 elements are split over the 2 ranks' files";
      std::set<std::string> files;
      for (const auto& c : ck.at("module.embeddings.weight.main").chunks) files.insert(c.file.substr(0, 3));
      EXPECT_EQ(files, (std::set<std::string>{"__0", "__1"}));
      EXPECT_TRUE(ck.tensors().count("module.blocks.1.routed_experts.w_up_gate.exp_avg"));
      EXPECT_TRUE(ck.metadata().byte_entries.count("__moe_skip_step_losses"));
    }
  }
}

// The recovered config is OLMo-core's own HF export's (nn/hf/config.py _get_olmo3moe_kda_emo_config), key by
// key.
TEST(OlmoCoreHybrid, ConfigEqualsOlmoCoresOwnHfExport) {
  const std::string path = kGolden + "/oracle/olmo_core_hf_hybrid.json";
  const auto ref = io::parse_json(io::read_file(path), path)["hf_config"];
  const auto ours =
      model::olmo_core::hf_config_json(io::parse_json(io::read_file(k1 + "/config.json"), "c"), "c");
  size_t compared = 0;
  for (const auto& [k, v] : ours.items()) {
    if (k == "architectures" || k == "torch_dtype" || k == "eos_token_id" || k == "pad_token_id") continue;
    ASSERT_TRUE(ref.contains(k)) << k;
    EXPECT_EQ(v, ref[k]) << k;
    ++compared;
  }
  EXPECT_GE(compared, 35u);
  for (const char* k : {"layer_types", "dense_layers_indices", "latent_moe_dim", "use_peri_ln", "embed_scale",
                        "scalable_softmax", "linear_value_head_dim", "shared_expert_intermediate_size"})
    EXPECT_TRUE(ours.contains(k)) << k;
  auto c = model::olmo_core::open(k1);
  EXPECT_EQ(c.config.model_type_name, "olmo3moe");
  EXPECT_EQ(c.config.eos_token_ids, std::vector<int64_t>{258});  // from dataset.tokenizer
}

// Every HF tensor of both layouts is OLMo-core's own convert_olmo3moe_state_to_hf output (1 process: its
// sha256; 2 processes: the same weights rounded to bfloat16, as OLMoDDPModel.apply_dp rounds them).
TEST(OlmoCoreHybrid, TensorsEqualOlmoCoresOwnHfConversion) {
  const std::string path = kGolden + "/oracle/olmo_core_hf_hybrid.json";
  const auto ref = io::parse_json(io::read_file(path), path)["tensors"];
  auto a = model::olmo_core::open(k1);
  auto b = model::olmo_core::open(kDirect);
  ASSERT_EQ(ref.size(), a.registry.size());
  ASSERT_EQ(b.registry.size(), a.registry.size());
  for (const auto& p : a.registry) {
    ASSERT_TRUE(ref.contains(p.name)) << p.name << " is not in OLMo-core's HF conversion";
    Tensor t = a.read(p.name);
    EXPECT_EQ(ref[p.name]["shape"].get<Shape>(), t.shape()) << p.name;
    EXPECT_EQ(ref[p.name]["sha256"], io::sha256_hex(t.raw_data(), t.nbytes())) << p.name;
    Tensor want = t.to(DType::BF16).to(DType::F32), got = b.read(p.name);
    ASSERT_EQ(got.shape(), want.shape()) << p.name;
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << p.name;
  }
  EXPECT_EQ(a.source.at("model.layers.1.mlp.experts.3.gate_proj.weight").name,
            "blocks.1.routed_experts.w_up_gate");
  EXPECT_EQ(b.key_of.at("model.layers.0.mlp.up_proj.weight"),
            "module.blocks.0.shared_experts.w_up_gate.main");
  EXPECT_EQ(a.key_of.at("model.layers.3.self_attn.g_proj.weight"), "model.blocks.3.attention.w_g.weight");
}

// The import writes an HF directory that loads with the same tensors; model.init's ParamFill serves them.
TEST(OlmoCoreHybrid, ExportAndParamFill) {
  TempDir t;
  auto c = model::olmo_core::open(kDirect);
  model::export_hf_dir(t / "hf", c.config, c.lazy_named(), {});
  auto hf = model::load_hf_dir(t / "hf");
  ASSERT_EQ(hf.registry.size(), c.registry.size());
  for (const auto& p : hf.registry)
    EXPECT_EQ(std::memcmp(hf.at(p.name).raw_data(), c.read(p.name).raw_data(), hf.at(p.name).nbytes()), 0)
        << p.name;
  model::ModelConfig cfg;
  auto fill = model::hf_param_fill(kDirect, &cfg);
  EXPECT_EQ(cfg.n_routed_experts, 8);
  for (size_t i = 0; i < c.registry.size(); ++i) {
    Tensor want = c.read(c.registry[i].name);
    std::vector<float> got(size_t(want.numel()));
    fill(i, 0, want.numel(), got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.raw_data(), want.nbytes()), 0) << c.registry[i].name;
  }
}

TEST(OlmoCoreHybridErrors, WrongShapeMissingAndUnexpectedTensorsAreNamed) {
  TempDir t;
  // Experts of hidden 12 instead of 16: the fused tensor is named with both shapes.
  auto cfg = edited_config(t, "hidden.json", [](auto& m) {
    for (const char* b : {"kda", "attn"}) m["block"][b]["routed_experts"]["hidden_size"] = 12;
  });
  std::string e = error_of([&] { model::olmo_core::open(k1, cfg); });
  EXPECT_NE(
      e.find(
          "checkpoint tensor 'model.blocks.1.routed_experts.w_up_gate' is [8, 32, 16], expected [8, 24, 16]"),
      std::string::npos)
      << e;
  e = error_of([&] { model::olmo_core::open(kDirect, cfg); });  // flat masters: the numel is named
  EXPECT_NE(e.find("'module.blocks.1.routed_experts.w_up_gate.main' is [4096], expected [8, 24, 16]"),
            std::string::npos)
      << e;
  // Layer 0 made an MoE layer: its router is missing.
  cfg = edited_config(t, "moe0.json", [](auto& m) { m["block_pattern"] = {"kda", "kda", "kda", "attn"}; });
  e = error_of([&] { model::olmo_core::open(k1, cfg); });
  EXPECT_NE(e.find("missing OLMo-core parameter 'blocks.0.routed_experts_router.weight' [256]"),
            std::string::npos)
      << e;
  // No attention gate in the config: the checkpoint's w_g is unexpected.
  cfg = edited_config(t, "nogate.json", [](auto& m) { m["block"]["attn"]["sequence_mixer"].erase("gate"); });
  e = error_of([&] { model::olmo_core::open(k1, cfg); });
  EXPECT_NE(e.find("unexpected model tensor(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("model.blocks.3.attention.w_g.weight [32, 32]"), std::string::npos) << e;
  // KDA values of head dim 8 (expand_v 1) instead of 16: a whole tensor, named by its HF and checkpoint
  // names.
  cfg = edited_config(t, "expand.json", [](auto& m) {
    for (const char* b : {"kda_dense", "kda"}) m["block"][b]["sequence_mixer"]["expand_v"] = 1.0;
  });
  e = error_of([&] { model::olmo_core::open(k1, cfg); });
  EXPECT_NE(e.find("model.layers.0.self_attn.v_proj.weight is [32, 32], expected [16, 32] (checkpoint tensor "
                   "'model.blocks.0.attention.w_v.weight')"),
            std::string::npos)
      << e;
}

TEST(OlmoCoreHybridErrors, UnsupportedSettingsAreRefusedByKey) {
  TempDir t;
  auto refused = [&](const char* name, const std::function<void(nlohmann::json&)>& edit, const char* needle) {
    std::string e = error_of([&] { model::olmo_core::open(k1, edited_config(t, name, edit)); });
    EXPECT_NE(e.find(needle), std::string::npos) << name << ": " << e;
  };
  refused(
      "fused.json", [](auto& m) { m["block"]["attn"]["sequence_mixer"]["name"] = "fused_v2"; },
      "model.block.attn.sequence_mixer.name is \"fused_v2\"");
  refused(
      "emo.json",
      [](auto& m) {
        m["block"]["kda"]["routed_experts_router"]["emo"] = {{"x", 1}};
      },
      "model.block.kda.routed_experts_router.emo");
  refused(
      "bias.json",
      [](auto& m) { m["block"]["kda"]["routed_experts_router"]["score_correction_bias"] = true; },
      "routed_experts_router.score_correction_bias");
  refused(
      "swa.json",
      [](auto& m) {
        m["block"]["attn"]["sequence_mixer"]["sliding_window"] = {{"pattern", {8}}};
      },
      "sequence_mixer.sliding_window");
  refused(
      "latbias.json", [](auto& m) { m["block"]["kda"]["latent_moe"]["bias"] = true; }, "latent_moe.bias");
  refused(
      "overrides.json",
      [](auto& m) {
        m["block_overrides"] = {{"1", m["block"]["kda"]}};
      },
      "model.block_overrides");
  refused(
      "prenorm.json", [](auto& m) { m["block"]["kda"]["use_pre_norm"] = true; }, "use_pre_norm");
  refused(
      "convbias.json", [](auto& m) { m["block"]["kda"]["sequence_mixer"]["conv_bias"] = true; }, "conv_bias");
  refused(
      "mixer.json", [](auto& m) { m["block"]["kda"]["sequence_mixer"]["type"] = "gated_delta_net"; },
      "sequence_mixer.type is \"gated_delta_net\"");
  refused(
      "eps.json", [](auto& m) { m["block"]["attn"]["layer_norm"]["eps"] = 1e-5; }, "rms_norm_eps");
}
