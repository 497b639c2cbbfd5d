// model: HF directory load / validate / export on small random models (D.1 and D.2 tiny configs), and the
// `export hf` / `model info` verbs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "model/hf_dir.h"

namespace fs = std::filesystem;
using namespace olmosft;
using namespace olmosft::model;
namespace st = olmosft::safetensors;
using json = nlohmann::json;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() / ("olmosft-hf-test-" + io::random_suffix())).string();
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return path + "/" + n; }
};

// A random HF directory for a preset: weights N(0, 0.02) stored in `dtype` (A_log/dt_bias in fp32),
// sharded when shard_bytes is small, plus tokenizer side files.
std::vector<st::NamedTensor> make_hf_dir(const std::string& dir, const json& config, DType dtype,
                                         uint64_t shard_bytes = st::kDefaultMaxShardSize) {
  fs::create_directories(dir);
  auto c = parse_config(config, "test config");
  save_config(c, dir + "/config.json", dtype);
  std::vector<st::NamedTensor> ts;
  uint64_t i = 0;
  for (const auto& p : param_registry(c)) {
    Tensor t = Tensor::empty(p.shape);
    fill_normal(t, Rng{42, i++}, 0.0f, 0.02f);
    ts.push_back({p.name, p.fp32_master_only ? t : t.to(dtype)});
  }
  st::write_sharded(dir, ts, shard_bytes);
  io::write_file_atomic(dir + "/tokenizer.json", "{\"model\": {\"type\": \"BPE\"}}\n");
  io::write_file_atomic(dir + "/tokenizer_config.json", "{\"eos_token\": \"<|endoftext|>\"}\n");
  io::write_file_atomic(dir + "/chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  io::write_file_atomic(dir + "/README.md", "not copied");
  return ts;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HfDir, LoadExportKeepIsByteIdentical) {
  for (const char* preset : {"olmo3-tiny", "olmo3moe-tiny"}) {
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      SCOPED_TRACE(std::string(preset) + " " + dtype_name(dt));
      TempDir d;
      auto written = make_hf_dir(d / "src", preset_config_json(preset), dt);
      auto m = load_hf_dir(d / "src");
      EXPECT_FALSE(m.sharded);
      EXPECT_EQ(m.tensors.size(), m.registry.size());
      for (const auto& t : written) EXPECT_TRUE(same_bytes(m.at(t.name), t.tensor)) << t.name;
      auto res =
          export_hf_dir(d / "out", m.config, m.named(), {std::nullopt, st::kDefaultMaxShardSize, d / "src"});
      auto back = load_hf_dir(d / "out");
      for (const auto& t : written) EXPECT_TRUE(same_bytes(back.at(t.name), t.tensor)) << t.name;
      // Same bytes on disk too (deterministic layout), and the config / side files are unchanged.
      EXPECT_EQ(io::sha256_file(d / "out/model.safetensors"), io::sha256_file(d / "src/model.safetensors"));
      EXPECT_EQ(io::read_file(d / "out/config.json"), io::read_file(d / "src/config.json"));
      EXPECT_EQ(io::read_file(d / "out/tokenizer.json"), io::read_file(d / "src/tokenizer.json"));
      EXPECT_EQ(io::read_file(d / "out/chat_template.jinja"), io::read_file(d / "src/chat_template.jinja"));
      EXPECT_FALSE(fs::exists(d / "out/README.md"));
      EXPECT_FALSE(fs::exists(d / "out/special_tokens_map.json"));
    }
  }
}

TEST(HfDir, ShardedRoundTripAndConversion) {
  TempDir d;
  auto written = make_hf_dir(d / "src", preset_config_json("olmo3moe-tiny"), DType::F32, 200000);
  auto m = load_hf_dir(d / "src");
  EXPECT_TRUE(m.sharded);
  EXPECT_GT(m.files.size(), 5u);
  // fp32 -> bf16: round-to-nearest-even of each value (Tensor::to), A_log / dt_bias stay fp32.
  export_hf_dir(d / "bf16", m.config, m.named(), {DType::BF16, 300000, d / "src"});
  auto b = load_hf_dir(d / "bf16");
  EXPECT_TRUE(b.sharded);
  EXPECT_EQ(b.config.original["torch_dtype"], "bfloat16");
  for (const auto& t : written) {
    const Tensor& got = b.at(t.name);
    bool fp32_kept = t.name.find("A_log") != std::string::npos || t.name.find("dt_bias") != std::string::npos;
    EXPECT_EQ(got.dtype(), fp32_kept ? DType::F32 : DType::BF16) << t.name;
    EXPECT_TRUE(same_bytes(got, fp32_kept ? t.tensor : t.tensor.to(DType::BF16))) << t.name;
  }
  // bf16 -> fp32 is exact; fp32 masters equal the widened values.
  export_hf_dir(d / "f32", b.config, b.named(), {DType::F32, st::kDefaultMaxShardSize, ""});
  auto f = load_hf_dir(d / "f32");
  EXPECT_FALSE(f.sharded);
  EXPECT_FALSE(fs::exists(d / "f32/tokenizer.json"));  // no side-file source given
  auto masters = b.fp32_masters();
  ASSERT_EQ(masters.size(), b.registry.size());
  for (const auto& mt : masters) {
    EXPECT_EQ(mt.tensor.dtype(), DType::F32);
    EXPECT_TRUE(same_bytes(f.at(mt.name), mt.tensor)) << mt.name;
    EXPECT_EQ(max_abs_diff(mt.tensor, b.at(mt.name).to(DType::F32)), 0.0);
  }
}

TEST(HfDir, ClearErrors) {
  TempDir d;
  json cfg = preset_config_json("olmo3-tiny");
  auto ts = make_hf_dir(d / "ok", cfg, DType::BF16);
  auto write_model = [&](const std::string& name, std::vector<st::NamedTensor> v) {
    fs::create_directories(d / name);
    io::write_file_atomic(d / (name + "/config.json"), cfg.dump());
    st::write(d / (name + "/model.safetensors"), v);
    return d / name;
  };
  // Missing + unexpected + wrong shape + wrong dtype, all listed.
  auto v = ts;
  v.erase(v.begin() + 3);                                   // missing
  v.push_back({"model.extra.weight", Tensor::zeros({3})});  // unexpected
  v[0].tensor = Tensor::zeros({512, 65}, DType::BF16);      // wrong shape
  v[1].tensor = Tensor::zeros(v[1].tensor.shape(), DType::I32);
  std::string e = error_of([&] { load_hf_dir(write_model("bad", v)); });
  EXPECT_NE(e.find("1 missing"), std::string::npos) << e;
  EXPECT_NE(e.find(ts[3].name), std::string::npos) << e;
  EXPECT_NE(e.find("1 unexpected"), std::string::npos) << e;
  EXPECT_NE(e.find("model.extra.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("model.embed_tokens.weight is [512, 65], expected [512, 64]"), std::string::npos) << e;
  EXPECT_NE(e.find("is I32, expected F32, BF16 or F16"), std::string::npos) << e;

  e = error_of([&] { load_hf_dir(d / "nope"); });
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
  fs::create_directories(d / "noweights");
  io::write_file_atomic(d / "noweights/config.json", cfg.dump());
  e = error_of([&] { load_hf_dir(d / "noweights"); });
  EXPECT_NE(e.find("no model.safetensors"), std::string::npos) << e;
  fs::create_directories(d / "noconfig");
  e = error_of([&] { load_hf_dir(d / "noconfig"); });
  EXPECT_NE(e.find("config.json: no such file"), std::string::npos) << e;

  // Sharded index inconsistent with the shards.
  make_hf_dir(d / "sh", cfg, DType::BF16, 100000);
  auto idx = json::parse(io::read_file(d / "sh/model.safetensors.index.json"));
  std::string embed_file = idx["weight_map"]["model.embed_tokens.weight"];
  ASSERT_NE(idx["weight_map"]["model.norm.weight"], embed_file);
  idx["weight_map"]["model.norm.weight"] = embed_file;
  io::write_file_atomic(d / "sh/model.safetensors.index.json", idx.dump());
  e = error_of([&] { load_hf_dir(d / "sh"); });
  EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("stored in"), std::string::npos) << e;

  // Export refuses a non-empty output and leaves no staging directory behind.
  auto m = load_hf_dir(d / "ok");
  fs::create_directories(d / "full");
  io::write_file_atomic(d / "full/x", "x");
  e = error_of([&] { export_hf_dir(d / "full", m.config, m.named(), {}); });
  EXPECT_NE(e.find("is not empty"), std::string::npos) << e;
  auto partial = m.named();
  partial.pop_back();
  e = error_of([&] { export_hf_dir(d / "out2", m.config, partial, {}); });
  EXPECT_NE(e.find("1 missing"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "out2"));
  for (const auto& ent : fs::directory_iterator(d.path)) {
    EXPECT_EQ(ent.path().filename().string().find(".tmp-"), std::string::npos) << ent.path();
  }
  // An existing empty directory is fine.
  fs::create_directories(d / "empty");
  EXPECT_NO_THROW(export_hf_dir(d / "empty", m.config, m.named(), {}));
}

TEST(HfDir, CliExportAndInfo) {
  TempDir d;
  make_hf_dir(d / "src", preset_config_json("olmo3moe-tiny"), DType::BF16);
  std::string bin = OLMOSFT_BINARY;
  std::string cmd = bin + " export hf --from " + (d / "src") + " --out " + (d / "out") +
                    " --dtype fp32 --shard-size 1MB > " + (d / "log") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << io::read_file(d / "log");
  EXPECT_NE(io::read_file(d / "log").find("exported 537 tensors"), std::string::npos)
      << io::read_file(d / "log");
  EXPECT_TRUE(fs::exists(d / "out/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(d / "out/tokenizer_config.json"));
  cmd = bin + " model info " + (d / "out") + " > " + (d / "info") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << io::read_file(d / "info");
  std::string info = io::read_file(d / "info");
  EXPECT_NE(info.find("1134064 (active per token 617968)"), std::string::npos) << info;
  EXPECT_NE(info.find("tensors             537"), std::string::npos) << info;
  EXPECT_NE(info.find("F32 x537"), std::string::npos) << info;
  // Errors exit 2 with the reason.
  cmd = bin + " export hf --from " + (d / "src") + " --out " + (d / "out") + " > " + (d / "err") + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2);
  EXPECT_NE(io::read_file(d / "err").find("is not empty"), std::string::npos) << io::read_file(d / "err");
  cmd = bin + " export hf --from " + (d / "src") + " --out " + (d / "o3") + " --shard-size 5XB > " +
        (d / "err") + " 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 2);
  EXPECT_NE(io::read_file(d / "err").find("unknown unit"), std::string::npos) << io::read_file(d / "err");
}

// The export verbs' flags (export hf, import olmo-core) read into ExportOptions in one place.
TEST(HfDir, ExportOptionsFromFlags) {
  EXPECT_FALSE(olmosft::model::parse_export_options("keep", "5GB").dtype.has_value());
  EXPECT_EQ(olmosft::model::parse_export_options("bf16", "500MB").dtype, olmosft::DType::BF16);
  EXPECT_EQ(olmosft::model::parse_export_options("fp32", "2GiB").max_shard_bytes, 2ull << 30);
  EXPECT_EQ(olmosft::model::parse_export_options("fp16", "64KiB").dtype, olmosft::DType::F16);
  try {
    (void)olmosft::model::parse_export_options("int8", "5GB");
    ADD_FAILURE() << "--dtype int8 accepted";
  } catch (const olmosft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dtype: expected bf16, fp32, fp16 or keep, got 'int8'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)olmosft::model::parse_export_options("keep", "lots"), olmosft::Error);
}
