// The trainer's side of src/dist, in one process: units of a real model (model_specs), ModelShards
// (per-layer residency for Olmo 3 in zero3, views in dp, weights handed back by finish()), and the sharded
// checkpoint writer/reader of train/checkpoint.h (files byte-identical to save_checkpoint's, in both modes;
// read back into either mode). The multi-process behaviour is tested by tests/e2e/train_mpi.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/rng.h"
#include "dist/comm.h"
#include "dist/model_shards.h"
#include "io/atomic_file.h"
#include "model/model.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using namespace olmosft;

namespace {

const std::string kTiny = std::string(OLMOSFT_SOURCE_DIR) + "/tests/golden/model/olmo3_tiny";

struct TmpDir {
  std::string path;
  TmpDir() {
    std::string t = (fs::temp_directory_path() / "olmosft-disttrain-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TmpDir() { fs::remove_all(path); }
};

std::vector<float> values(model::CausalLM& m) {
  std::vector<float> v;
  for (auto& p : m.params())
    v.insert(v.end(), p.value.data<float>(), p.value.data<float>() + p.value.numel());
  return v;
}

}  // namespace

TEST(DistTrain, ModelSpecsAreOneUnitPerBlockPlusTheEnds) {
  auto m = model::load_model(kTiny);
  auto specs = dist::model_specs(m->params());
  const int L = int(m->config().num_hidden_layers);
  int max_unit = 0;
  for (const auto& s : specs) {
    max_unit = std::max(max_unit, s.unit);
    if (s.name == "model.embed_tokens.weight") {
      EXPECT_EQ(s.unit, 0);
    }
    if (s.name == "model.norm.weight" || s.name == "lm_head.weight") {
      EXPECT_EQ(s.unit, L + 1) << s.name;
    }
    if (s.name.rfind("model.layers.3.", 0) == 0) {
      EXPECT_EQ(s.unit, 4) << s.name;
    }
  }
  EXPECT_EQ(max_unit, L + 1);
}

TEST(DistTrain, ModelShardsPerLayerInZero3AndFinishHandsTheWeightsBack) {
  auto comm = dist::make_single_comm();
  auto m = model::load_model(kTiny);
  const std::vector<float> before = values(*m);
  {
    dist::ModelShards z(*comm, *m, dist::ShardMode::Sharded);
    EXPECT_TRUE(z.per_layer());  // Olmo 3 honours the residency hooks
    for (auto& p : m->params()) EXPECT_FALSE(p.value.defined()) << p.name << " kept storage in zero3";
    z.bind_params();
    EXPECT_EQ(values(*m), before);
    z.release_params();
    z.finish();
  }
  EXPECT_EQ(values(*m), before);
  {
    dist::ModelShards r(*comm, *m, dist::ShardMode::Replicated);
    EXPECT_FALSE(r.per_layer());
    EXPECT_EQ(values(*m), before);  // dp: views of the replicated masters
  }  // destructor without finish(): the model still gets owned copies (one process)
  EXPECT_EQ(values(*m), before);
}

TEST(DistTrain, ShardedCheckpointIsByteIdenticalToTheSingleWriterAndLoadsInEitherMode) {
  TmpDir tmp;
  auto comm = dist::make_single_comm();
  auto m = model::load_model(kTiny);
  std::vector<Tensor> m1, m2;
  for (size_t i = 0; i < m->params().size(); ++i) {
    const auto& p = m->params()[i];
    m1.push_back(Tensor::zeros(p.value.shape()));
    m2.push_back(Tensor::zeros(p.value.shape()));
    fill_normal(m1.back(), Rng{7, 2 * i}, 0.0f, 1.0f);
    fill_normal(m2.back(), Rng{7, 2 * i + 1}, 0.0f, 1.0f);
  }
  train::CheckpointState st;
  st.step = 5;
  st.info["note"] = "x";
  const std::string ref = train::save_checkpoint(tmp.path + "/ref", m->params(), m1, m2, st, "recipe\n", 3);
  for (auto mode : {dist::ShardMode::Sharded, dist::ShardMode::Replicated}) {
    auto m2p = model::load_model(kTiny);
    dist::ModelShards sh(*comm, *m2p, mode);
    // Moments into the shards, as the trainer's AdamW would have left them.
    for (auto& r : sh.params().owned_ranges()) {
      std::copy(m1[size_t(r.tensor)].data<float>() + r.begin,
                m1[size_t(r.tensor)].data<float>() + r.begin + r.n, r.m);
      std::copy(m2[size_t(r.tensor)].data<float>() + r.begin,
                m2[size_t(r.tensor)].data<float>() + r.begin + r.n, r.v);
    }
    const std::string root = tmp.path + "/" + dist::mode_name(mode);
    const std::string dir = train::save_checkpoint_sharded(root, sh.params(), st, "recipe\n", 3);
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json", "SHA256SUMS"})
      EXPECT_EQ(io::read_file(dir + "/" + f), io::read_file(ref + "/" + f))
          << f << " differs in mode " << dist::mode_name(mode);
    EXPECT_NO_THROW(train::verify_checkpoint(dir));
    // Read back into the other mode.
    auto m3 = model::load_model(kTiny);
    for (auto& p : m3->params()) p.value.zero();
    dist::ModelShards back(
        *comm, *m3,
        mode == dist::ShardMode::Sharded ? dist::ShardMode::Replicated : dist::ShardMode::Sharded);
    EXPECT_EQ(train::load_checkpoint_sharded(dir, back.params()).step, 5);
    for (auto& r : back.params().owned_ranges()) {
      ASSERT_EQ(0, std::memcmp(r.m, m1[size_t(r.tensor)].data<float>() + r.begin, size_t(r.n) * 4));
      ASSERT_EQ(0, std::memcmp(r.v, m2[size_t(r.tensor)].data<float>() + r.begin, size_t(r.n) * 4));
    }
    back.finish();
    EXPECT_EQ(values(*m3), values(*m));
  }
  // A checkpoint of another model is refused with the tensor named.
  dist::ShardedParams other(*comm, {{"x.weight", {4, 4}, 0, true}}, dist::ShardMode::Sharded);
  try {
    train::load_checkpoint_sharded(ref, other);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensors, the model has 1"), std::string::npos) << e.what();
  }
}
