// The distcp reader and the OLMo-core import on checkpoints written by OLMo-core 3.0.0's own
// save_model_and_optim_state (tests/golden/distcp, tests/reference/olmo_core_distcp.py): every tensor equals
// the writer's, the FSDP-split (2 process) save reassembles, the config and names map onto the registry,
// and damaged inputs (metadata, shard, offset, foreign classes, wrong config) fail with an error naming the
// file and the problem, writing nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

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

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() / ("olmosft-distcp-test-" + io::random_suffix())).string();
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

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Copies a fixture step directory so a test can damage it.
std::string copy_step(const TempDir& t, const std::string& name) {
  const std::string dst = t / name;
  fs::copy(kGolden + "/" + name, dst, fs::copy_options::recursive);
  return dst;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

}  // namespace

class DistcpFixture : public ::testing::TestWithParam<std::string> {};

// Every model tensor read from the checkpoint is byte-identical to the one OLMo-core held when it saved.
TEST_P(DistcpFixture, EveryModelTensorEqualsTheWriters) {
  const std::string name = GetParam();
  auto ck = distcp::Checkpoint::open(kGolden + "/olmo3_" + name + "/model_and_optim");
  auto ref = safetensors::Reader::open(kGolden + "/oracle/tensors_" + name + ".safetensors");
  size_t n = 0, split = 0;
  for (const auto& t : ref->tensors()) {
    const std::string key = "model." + t.name;
    const auto& e = ck.at(key);
    if (e.chunks.size() > 1) ++split;
    Tensor got = ck.read(key);
    EXPECT_TRUE(same_bytes(got, ref->view(t.name))) << key;
    ++n;
  }
  EXPECT_EQ(n, 47u);  // 4 layers x 11 + embeddings, final norm, lm_head
  size_t model_keys = 0;
  for (const auto& [k, e] : ck.tensors()) model_keys += k.rfind("model.", 0) == 0;
  EXPECT_EQ(model_keys, n);
  // Optimizer state is there too (skipped by the import): AdamW's exp_avg per parameter.
  EXPECT_TRUE(ck.tensors().count("optim.state.embeddings.weight.exp_avg"));
  if (name == "2proc") {
    EXPECT_EQ(split, n) << "FSDP splits every tensor across the two ranks' files";
    std::set<std::string> files;
    for (const auto& c : ck.at("model.embeddings.weight").chunks) files.insert(c.file.substr(0, 3));
    EXPECT_EQ(files, (std::set<std::string>{"__0", "__1"}));
    EXPECT_EQ(*ck.at("model.embeddings.weight").dtype, DType::BF16);
  } else {
    EXPECT_EQ(*ck.at("model.embeddings.weight").dtype, DType::F32);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, DistcpFixture, ::testing::Values("1proc", "2proc"));

TEST(OlmoCore, ConfigAndNamesMapOntoTheRegistry) {
  auto c = model::olmo_core::open(kGolden + "/olmo3_2proc");
  EXPECT_EQ(c.config.model_type_name, "olmo3");
  EXPECT_EQ(c.config.hidden_size, 12);
  EXPECT_EQ(c.config.head_dim, 4);
  EXPECT_EQ(c.config.num_attention_heads, 4);
  EXPECT_EQ(c.config.num_key_value_heads, 2);
  EXPECT_EQ(c.config.intermediate_size, 40);
  EXPECT_EQ(c.config.sliding_window, 6);
  EXPECT_DOUBLE_EQ(c.config.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.config.vocab_size, 264);
  EXPECT_EQ(c.config.eos_token_ids, std::vector<int64_t>{258});  // from dataset.tokenizer
  EXPECT_EQ(c.config.pad_token_id, 259);
  EXPECT_DOUBLE_EQ(c.config.rope_full.rope_theta, 500000.0);
  // force_full_attention_on_first_layer: the pattern [6, 6, 6, -1] starts at layer 1; the last layer is full.
  using LT = model::LayerType;
  EXPECT_EQ(c.config.layer_types, (std::vector<LT>{LT::FullAttention, LT::SlidingAttention,
                                                   LT::SlidingAttention, LT::FullAttention}));
  EXPECT_EQ(c.key_of.size(), c.registry.size());
  EXPECT_EQ(c.key_of.at("model.layers.2.mlp.down_proj.weight"), "model.blocks.2.feed_forward.w2.weight");
  EXPECT_EQ(c.key_of.at("model.layers.0.post_attention_layernorm.weight"),
            "model.blocks.0.attention_norm.weight");
  EXPECT_EQ(model::olmo_core::hf_name("blocks.07.attention.w_q.weight"), "");
  EXPECT_EQ(model::olmo_core::hf_name("blocks.1.attention.w_qkv.weight"), "");
}

// OLMo-core's own HF conversion (save_hf_model, recorded by the generator) is the reference for the mapping:
// the same HF names, shapes and bytes for every tensor, and the same layer types and window.
TEST(OlmoCore, MappingEqualsOlmoCoresOwnHfConversion) {
  const std::string path = kGolden + "/oracle/olmo_core_hf_1proc.json";
  const auto ref = io::parse_json(io::read_file(path), path);
  auto c = model::olmo_core::open(kGolden + "/olmo3_1proc");
  ASSERT_EQ(ref["tensors"].size(), c.registry.size());
  for (const auto& p : c.registry) {
    ASSERT_TRUE(ref["tensors"].contains(p.name)) << p.name << " is not in OLMo-core's HF conversion";
    const auto& r = ref["tensors"][p.name];
    Tensor t = c.read(p.name);
    EXPECT_EQ(r["shape"].get<Shape>(), t.shape()) << p.name;
    EXPECT_EQ(r["dtype"], "torch.float32") << p.name;
    EXPECT_EQ(r["sha256"], io::sha256_hex(t.raw_data(), t.nbytes())) << p.name;
  }
  std::vector<std::string> types;
  for (auto lt : c.config.layer_types) types.push_back(model::layer_type_name(lt));
  EXPECT_EQ(ref["hf_config"]["layer_types"].get<std::vector<std::string>>(), types);
  EXPECT_EQ(ref["hf_config"]["sliding_window"], c.config.sliding_window);
  EXPECT_EQ(ref["hf_config"]["num_key_value_heads"], c.config.num_key_value_heads);
  EXPECT_EQ(ref["hf_config"]["intermediate_size"], c.config.intermediate_size);
}

// The import writes an HF directory that loads and holds the same tensors (stored dtype kept).
TEST(OlmoCore, ExportKeepsEveryTensor) {
  TempDir t;
  auto c = model::olmo_core::open(kGolden + "/olmo3_1proc");
  size_t reads = 0;
  model::export_hf_dir(t / "hf", c.config, c.lazy_named([&](const std::string&, uint64_t) { ++reads; }), {});
  EXPECT_EQ(reads, c.registry.size());
  auto hf = model::load_hf_dir(t / "hf");
  for (const auto& p : hf.registry) EXPECT_TRUE(same_bytes(hf.at(p.name), c.read(p.name))) << p.name;
}

// model.init with a step directory: the ParamFill a ZeRO-3 rank uses gives each tensor's fp32 values, in any
// pieces, and load_init_config gives the mapped config.
TEST(OlmoCore, ParamFillServesShardsOfEveryTensor) {
  const std::string step = kGolden + "/olmo3_2proc";
  model::ModelConfig cfg;
  auto fill = model::hf_param_fill(step, &cfg);
  EXPECT_EQ(cfg.num_key_value_heads, 2);
  EXPECT_EQ(model::load_init_config(step).intermediate_size, 40);
  auto c = model::olmo_core::open(step);
  for (size_t i = 0; i < c.registry.size(); ++i) {
    Tensor want = c.read(c.registry[i].name).to(DType::F32);
    const int64_t n = want.numel(), half = n / 2;
    std::vector<float> got(static_cast<size_t>(n));
    fill(i, half, n - half, got.data() + half);  // second half first: a rank's shard
    fill(i, 0, half, got.data());
    EXPECT_EQ(std::memcmp(got.data(), want.raw_data(), size_t(n) * 4), 0) << c.registry[i].name;
  }
  EXPECT_THROW(fill(0, 0, 1'000'000, nullptr), Error);
}

TEST(DistcpErrors, DamagedMetadataNamesTheFile) {
  TempDir t;
  const std::string step = copy_step(t, "olmo3_1proc");
  const std::string meta = step + "/model_and_optim/.metadata";
  auto bytes = io::read_file_bytes(meta);
  auto cut = bytes;
  cut.resize(bytes.size() / 2);
  write_bytes(meta, cut);
  std::string e = error_of([&] { distcp::Checkpoint::open(step + "/model_and_optim"); });
  EXPECT_NE(e.find(".metadata"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  auto flipped = bytes;
  flipped[200] = 0xff;  // an opcode byte inside the first entries
  write_bytes(meta, flipped);
  e = error_of([&] { distcp::Checkpoint::open(step + "/model_and_optim"); });
  EXPECT_NE(e.find(".metadata"), std::string::npos) << e;
  fs::remove(meta);
  e = error_of([&] { distcp::Checkpoint::open(step + "/model_and_optim"); });
  EXPECT_NE(e.find(".metadata: missing"), std::string::npos) << e;
}

TEST(DistcpErrors, TruncatedShardNamesTheFileAndTensor) {
  TempDir t;
  const std::string step = copy_step(t, "olmo3_2proc");
  const std::string shard = step + "/model_and_optim/__1_0.distcp";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  std::string e = error_of([&] { distcp::Checkpoint::open(step + "/model_and_optim"); });
  EXPECT_NE(e.find("__1_0.distcp"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor '"), std::string::npos) << e;
}

TEST(DistcpErrors, WrongOffsetNamesTheChunk) {
  auto bytes = io::read_file_bytes(kGolden + "/olmo3_1proc/model_and_optim/.metadata");
  auto meta = distcp::parse_metadata(bytes.data(), bytes.size(), "m");
  // Point a chunk 64 bytes into its item: the torch.save archive is not found where the metadata says.
  TempDir t;
  const std::string step = copy_step(t, "olmo3_1proc");
  const auto& e = meta.tensors.at("model.blocks.0.attention.w_q.weight");
  const std::string shard = step + "/model_and_optim/" + e.chunks[0].file;
  auto data = io::read_file_bytes(shard);
  // Shift the file's bytes so every stored offset is off by 64.
  data.insert(data.begin(), 64, 0);
  write_bytes(shard, data);
  auto ck = distcp::Checkpoint::open(step + "/model_and_optim");
  std::string err = error_of([&] { ck.read("model.blocks.0.attention.w_q.weight"); });
  EXPECT_NE(err.find(e.chunks[0].file), std::string::npos) << err;
  EXPECT_NE(err.find("model.blocks.0.attention.w_q.weight"), std::string::npos) << err;
}

TEST(DistcpErrors, ConfigMismatchAndMissingTensorsAreNamed) {
  TempDir t;
  const std::string step = copy_step(t, "olmo3_1proc");
  std::string cfg = io::read_file(step + "/config.json");
  auto at = cfg.find("\"hidden_size\": 40");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 17, "\"hidden_size\": 48");
  io::write_file_atomic(t / "wrong.json", cfg);
  std::string e = error_of([&] { model::olmo_core::open(step, t / "wrong.json"); });
  EXPECT_NE(e.find("mlp.gate_proj.weight is [40, 12], expected [48, 12]"), std::string::npos) << e;
  auto moe = cfg;
  moe.replace(moe.find("\"name\": \"reordered_norm\""), 24, "\"name\": \"moe_reordered_norm\"");
  io::write_file_atomic(t / "moe.json", moe);
  e = error_of([&] { model::olmo_core::open(step, t / "moe.json"); });
  EXPECT_NE(e.find("model.block.name"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { model::olmo_core::open(t / "nope"); }).find("does not exist"), std::string::npos);
}

TEST(DistcpErrors, ExportWritesNothingOnError) {
  TempDir t;
  const std::string step = copy_step(t, "olmo3_2proc");
  auto c = model::olmo_core::open(step);
  fs::resize_file(step + "/model_and_optim/__0_3.distcp", 100);  // damaged after the checks on open
  std::string e = error_of([&] { model::export_hf_dir(t / "hf", c.config, c.lazy_named(), {}); });
  EXPECT_NE(e.find("__0_3.distcp"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(t / "hf"));
  for (const auto& f : fs::directory_iterator(t.path))
    EXPECT_EQ(f.path().filename().string().find("hf."), std::string::npos);
}
