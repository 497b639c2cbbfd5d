// ZeRO-3 at 1/N while loading and for gradients: a model without parameter storage filled per rank from
// ranged reads of the safetensors files (model::hf_param_fill) or a one-tensor-at-a-time random init
// (model::init_param_fill) holds the same values as load_model / make_model; each rank's peak RSS while
// loading a 200 MB model (VmHWM, /proc/self/status) shrinks with the rank count (mpirun -np 1, 2, 4 of this
// executable; ratios against the 1-rank peak of the same run); a model that writes a unit's gradient after
// declaring its backward done is refused.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/threads.h"
#include "dist/comm.h"
#include "dist/model_shards.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "model/model.h"
#include "mpi_test_util.h"
#include "train/batch.h"
#include "train/perf.h"

namespace fs = std::filesystem;
using namespace olmosft;

namespace {

constexpr int64_t kLeaves = 4, kT = 16;

// VmHWM (peak resident set) of this process, bytes.
double vm_hwm() { return train::proc_status_bytes("VmHWM"); }

// Olmo 3, 12 blocks of d 512 (4.2M parameters each) and vocab 4096: 54M parameters, blocks ~93%.
nlohmann::json wide_config() {
  nlohmann::json j = model::preset_config_json("olmo3-tiny");
  j["hidden_size"] = 512;
  j["intermediate_size"] = 2048;
  j["num_attention_heads"] = 8;
  j["num_key_value_heads"] = 4;
  j["num_hidden_layers"] = 12;
  j["vocab_size"] = 4096;
  j["eos_token_id"] = 4094;
  j["pad_token_id"] = 4095;
  nlohmann::json types = nlohmann::json::array();
  for (int l = 0; l < 12; ++l) types.push_back(l % 4 == 3 ? "full_attention" : "sliding_attention");
  j["layer_types"] = types;
  return j;
}

// Writes an HF dir of `config` (random init, seed 5) in `dtype`.
void write_model(const std::string& dir, const nlohmann::json& config, DType dtype,
                 uint64_t shard_bytes = 0) {
  const model::ModelConfig c = model::parse_config(config, "test config");
  auto m = model::make_model(c, 5);
  model::ExportOptions o;
  o.dtype = dtype;
  if (shard_bytes) o.max_shard_bytes = shard_bytes;
  model::export_hf_dir(dir, c, model::export_tensors(*m), o);
}

// Everything a model holds, flattened (registry order).
std::vector<float> values(model::CausalLM& m) {
  std::vector<float> v;
  for (auto& p : m.params())
    v.insert(v.end(), p.value.data<float>(), p.value.data<float>() + p.value.numel());
  return v;
}

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("olmosft_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

// One training step of kLeaves leaves of kT tokens (this rank's share), as the trainer drives ModelShards.
void one_step(dist::Comm& comm, dist::ModelShards& shards, model::CausalLM& m) {
  const int64_t N = comm.size(), V = m.config().vocab_size;
  std::vector<int32_t> tok(kT), seg(kT, 0), pos(kT), tgt(kT);
  std::vector<uint8_t> trained(kT, 1);
  shards.bind_for_step();
  shards.begin_step(kLeaves / N);
  for (int64_t k = 0; k < kLeaves / N; ++k) {
    const int64_t leaf = shards.leaf_index(k);
    for (int64_t t = 0; t < kT; ++t) {
      tok[size_t(t)] = int32_t((leaf * 131 + t * 17) % (V - 2));
      tgt[size_t(t)] = int32_t((leaf * 131 + t * 17 + 5) % (V - 2));
      pos[size_t(t)] = int32_t(t);
    }
    shards.begin_leaf();
    m.forward_backward(train::batch_view(1, kT, tok, seg, pos, tgt, trained), model::LossConfig{},
                       1.0 / double(kLeaves * kT), 1.0 / double(kLeaves));
    shards.end_leaf();
  }
  shards.reduce();
  shards.release_params();
  AdamWConfig a;
  shards.params().clip_and_step(a, 1.0, 1);
}

using mpitest::MpiRun;

// mpirun -np N <this test binary> --gtest_filter=DistMemoryWorker.Run with the `env` assignments.
MpiRun mpirun(int np, const std::string& env, const fs::path& scratch, int limit = 300) {
  return mpitest::mpirun_worker(np, env, "DistMemoryWorker.Run", scratch, limit);
}

// Per rank: VmHWM at start, after loading, after one step (bytes).
struct Peaks {
  std::vector<double> base, load, step;
};

Peaks read_peaks(const std::string& path) {
  Peaks p;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);) {
    std::istringstream is(l);
    int r = 0;
    double b = 0, lo = 0, s = 0;
    if (is >> r >> b >> lo >> s) p.base.push_back(b), p.load.push_back(lo), p.step.push_back(s);
  }
  return p;
}

// A three-unit model (before / one block / after) that follows the residency contract, or, with
// `late`, writes its block's gradient once more after done(1) in the backward.
class ContractModel : public model::CausalLM {
 public:
  explicit ContractModel(bool late) : late_(late) {
    cfg_.model_type_name = "contract";
    for (const char* n : {"model.embed_tokens.weight", "model.layers.0.w", "lm_head.weight"}) {
      model::Param p;
      p.name = n;
      p.value = Tensor::zeros({300});
      p.grad = Tensor::zeros({300});
      ps_.push_back(p);
    }
  }
  const model::ModelConfig& config() const override { return cfg_; }
  std::vector<model::Param>& params() override { return ps_; }
  bool set_param_residency(model::ParamResidency h) override {
    h_ = std::move(h);
    return true;
  }
  model::LossParts forward_backward(const model::Batch&, const model::LossConfig&, double, double) override {
    for (int g : {0, 1}) h_.need(g), h_.done(g);
    h_.need(2);
    add(2), h_.done(2);  // the loss gradient through the last unit
    h_.need(1), add(1), h_.done(1);
    if (late_) add(1);
    add(0);  // the embedding's gradient, after every done()
    return {};
  }
  model::LossParts forward(const model::Batch&, const model::LossConfig&, float*, float*) override {
    return {};
  }

 private:
  void add(int g) {
    float* d = ps_[size_t(g)].grad.data<float>();
    for (int i = 0; i < 300; ++i) d[i] += float(g + 1);
  }
  bool late_;
  model::ModelConfig cfg_;
  std::vector<model::Param> ps_;
  model::ParamResidency h_;
};

}  // namespace

TEST(DistMemory, ParamFillsHoldWhatLoadModelAndMakeModelHold) {
  if (dist::launched_under_mpi()) GTEST_SKIP();
  TmpDir d("param_fill");
  const nlohmann::json cfg = model::preset_config_json("olmo3moe-tiny");
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    const std::string dir = (d.path / dtype_name(dt)).string();
    write_model(dir, cfg, dt, dt == DType::F32 ? 100000 : 0);  // F32: sharded into several files
    auto ref = model::load_model(dir);
    model::ModelConfig c;
    const model::ParamFill fill = model::hf_param_fill(dir, &c);
    auto& ps = ref->params();
    for (size_t i = 0; i < ps.size(); ++i) {
      const int64_t n = ps[i].value.numel(), lo = n / 3, hi = n - n / 5;
      std::vector<float> got(size_t(n), -1.0f);
      fill(i, 0, lo, got.data());  // three ranged reads cover the tensor
      fill(i, lo, hi - lo, got.data() + lo);
      fill(i, hi, n - hi, got.data() + hi);
      ASSERT_EQ(0, std::memcmp(got.data(), ps[i].value.data<float>(), size_t(n) * 4))
          << ps[i].name << " " << dir;
    }
    try {
      std::vector<float> x(8);
      fill(0, ps[0].value.numel() - 4, 8, x.data());
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("outside"), std::string::npos) << e.what();
    }
  }
  const model::ModelConfig c = model::parse_config(cfg, "preset");
  auto made = model::make_model(c, 11);
  auto hollow = model::make_model_unallocated(c);
  for (auto& p : hollow->params()) EXPECT_FALSE(p.value.defined() || p.grad.defined()) << p.name;
  const model::ParamFill init = model::init_param_fill(c, 11);
  for (size_t i = 0; i < made->params().size(); ++i) {
    const auto& p = made->params()[i];
    std::vector<float> got(size_t(p.value.numel()));
    init(i, 0, p.value.numel(), got.data());
    ASSERT_EQ(0, std::memcmp(got.data(), p.value.data<float>(), got.size() * 4)) << p.name;
  }
  // Through ModelShards (zero3, one process): the hollow model ends with make_model's values.
  auto comm = dist::make_single_comm();
  {
    dist::ModelShards sh(*comm, *hollow, dist::ShardMode::Sharded, true, init);
    sh.finish();
  }
  EXPECT_EQ(values(*hollow), values(*made));
  auto again = model::make_model_unallocated(c);
  EXPECT_THROW(dist::ModelShards(*comm, *again, dist::ShardMode::Sharded), Error);  // no fill given
}

TEST(DistMemory, GradientWrittenAfterItsBackwardWasDeclaredDoneIsRefused) {
  if (dist::launched_under_mpi()) GTEST_SKIP();
  auto comm = dist::make_single_comm();
  for (int64_t leaves : {1, 2}) {
    ContractModel ok(false), late(true);
    dist::ModelShards s(*comm, ok, dist::ShardMode::Sharded);
    s.begin_step(leaves);
    for (int64_t k = 0; k < leaves; ++k) {
      s.begin_leaf();
      ok.forward_backward({}, {}, 1, 1);
      s.end_leaf();
    }
    s.reduce();
    // Unit u's gradient is (u + 1) per leaf on every element: nothing lost, padding zero.
    for (int u = 0; u < 3; ++u)
      for (int64_t i = 0; i < s.params().unit_shard(u); ++i)
        ASSERT_EQ(s.params().owned_grad(u)[i], i < 300 ? float(leaves * (u + 1)) : 0.0f) << u << " " << i;
    dist::ModelShards b(*comm, late, dist::ShardMode::Sharded);
    b.begin_step(leaves);
    b.begin_leaf();
    late.forward_backward({}, {}, 1, 1);
    try {
      b.end_leaf();
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("residency group 1 after its backward"), std::string::npos)
          << e.what();
    }
  }
}

// The worker: loads the model of OLMOSFT_DIST_MEMORY_MODEL (zero3; OLMOSFT_DIST_MEMORY_LEGACY=1: the old way,
// load_model on every rank and then ModelShards) and runs one step; rank 0 writes "rank base load step".
TEST(DistMemoryWorker, Run) {
  const char* out = std::getenv("OLMOSFT_DIST_MEMORY_WORKER");
  if (!out) GTEST_SKIP() << "only runs under mpirun, started by DistMemory tests";
  set_threads(1);
  auto comm = dist::make_comm();
  const std::string dir = std::getenv("OLMOSFT_DIST_MEMORY_MODEL");
  const bool legacy = std::getenv("OLMOSFT_DIST_MEMORY_LEGACY") != nullptr;
  double peaks[3] = {vm_hwm(), 0, 0};
  std::unique_ptr<model::CausalLM> m;
  model::ParamFill fill;
  if (legacy) {
    m = model::load_model(dir);
  } else {
    model::ModelConfig c;
    fill = model::hf_param_fill(dir, &c);
    m = model::make_model_unallocated(c);
  }
  {
    dist::ModelShards shards(*comm, *m, dist::ShardMode::Sharded, true, fill);
    peaks[1] = vm_hwm();
    one_step(*comm, shards, *m);
    peaks[2] = vm_hwm();
    shards.release_params();
    std::vector<double> all(3 * size_t(comm->size()));
    comm->all_gather(peaks, all.data(), 3);
    if (comm->rank() == 0) {
      std::ofstream f(out);
      for (int r = 0; r < comm->size(); ++r)
        f << r << " " << all[3 * size_t(r)] << " " << all[3 * size_t(r) + 1] << " " << all[3 * size_t(r) + 2]
          << "\n";
    }
    shards.finish();  // collective; hands the weights back
  }
}

// The load peak per rank (VmHWM after loading minus at start) shrinks about as 1/N: at most 1/N + 0.1 of the
// 1-rank peak (measured in the same run), where the old way (every rank loads everything) stays >= 0.75.
TEST(DistMemory, LoadPeakShrinksWithRanks) {
  if (dist::launched_under_mpi()) GTEST_SKIP();
  TmpDir d("dist_memory");
  const std::string dir = (d.path / "model").string();
  write_model(dir, wide_config(), DType::F32);  // 217 MB of fp32 tensors
  std::vector<double> load1;
  for (int np : {1, 2, 4}) {
    const std::string out = (d.path / ("r" + std::to_string(np))).string();
    const MpiRun r = mpirun(
        np, "OLMOSFT_DIST_MEMORY_WORKER='" + out + "' OLMOSFT_DIST_MEMORY_MODEL='" + dir + "'", d.path);
    ASSERT_EQ(r.rc, 0) << "mpirun -np " << np << " failed:\n" << r.log;
    const Peaks p = read_peaks(out);
    ASSERT_EQ(p.base.size(), size_t(np)) << r.log;
    for (int k = 0; k < np; ++k) {
      const double load = p.load[size_t(k)] - p.base[size_t(k)];
      if (np == 1) load1.push_back(load);
      std::printf("ranks %d rank %d: load peak +%.1f MB (%.3f of 1 rank), step peak +%.1f MB\n", np, k,
                  load / 1e6, load / load1[0], (p.step[size_t(k)] - p.base[size_t(k)]) / 1e6);
      EXPECT_LE(load / load1[0], 1.0 / np + 0.1) << np << " ranks, rank " << k;
    }
  }
  const std::string out = (d.path / "legacy2").string();
  const MpiRun r = mpirun(2,
                          "OLMOSFT_DIST_MEMORY_LEGACY=1 OLMOSFT_DIST_MEMORY_WORKER='" + out +
                              "' OLMOSFT_DIST_MEMORY_MODEL='" + dir + "'",
                          d.path);
  ASSERT_EQ(r.rc, 0) << r.log;
  const Peaks p = read_peaks(out);
  ASSERT_EQ(p.base.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    const double load = p.load[size_t(k)] - p.base[size_t(k)];
    std::printf("legacy load, ranks 2 rank %d: +%.1f MB (%.3f of 1 rank)\n", k, load / 1e6, load / load1[0]);
    EXPECT_GE(load / load1[0], 0.75) << "the old way holds the whole model on every rank";
  }
}
