// The hybrid (olmo3moe) under dist::ModelShards: it honours the per-layer residency hooks, and ZeRO-3
// training with per-layer gathering is bit-identical to unsharded training (dp on one rank) at 1, 2 and 4
// ranks (the multi-rank runs re-launch this executable under mpirun, like dist_test.cpp).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/threads.h"
#include "dist/comm.h"
#include "dist/model_shards.h"
#include "kernels/adamw.h"
#include "model/config.h"
#include "model/model.h"
#include "mpi_test_util.h"
#include "train/batch.h"

namespace fs = std::filesystem;
using namespace olmosft;

namespace {

constexpr int64_t kLeaves = 4, kSteps = 3, kT = 24;

model::ModelConfig tiny_config() {
  return model::load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3moe_tiny/config.json");
}

// Leaf `leaf` of step `step`: one packed row of two documents and some padding; every position with a
// next token in its document is trained.
struct Leaf {
  std::vector<int32_t> tokens, segments, positions, targets;
  std::vector<uint8_t> trained;
  int64_t trained_count = 0;
  Leaf(int64_t step, int64_t leaf, int64_t vocab) {
    const size_t T = static_cast<size_t>(kT);
    tokens.assign(T, 0), segments.assign(T, -1), positions.assign(T, 0), targets.assign(T, -100);
    trained.assign(T, 0);
    const int64_t first = 7 + (step * 5 + leaf * 3) % 9, second = kT - 4 - first;
    uint32_t s = static_cast<uint32_t>(1000 * step + leaf + 1);
    int64_t t = 0;
    int32_t id = 0;
    for (int64_t len : {first, second}) {
      for (int64_t p = 0; p < len; ++p, ++t) {
        s = s * 1664525u + 1013904223u;
        tokens[size_t(t)] = static_cast<int32_t>(2 + (s >> 8) % static_cast<uint32_t>(vocab - 2));
        segments[size_t(t)] = id;
        positions[size_t(t)] = static_cast<int32_t>(p);
      }
      ++id;
    }
    for (size_t i = 0; i + 1 < T; ++i)
      if (segments[i] >= 0 && segments[i + 1] == segments[i]) {
        targets[i] = tokens[i + 1];
        trained[i] = 1;
        ++trained_count;
      }
  }
  model::Batch batch() const {
    return olmosft::train::batch_view(1, kT, tokens, segments, positions, targets, trained);
  }
};

// kSteps steps of kLeaves leaves (this rank's share) with AdamW; returns one line per step (the global
// gradient norm, exact bits) and a digest line of the final weights.
std::vector<std::string> train_steps(dist::Comm& comm, dist::ShardMode mode, bool* per_layer) {
  set_threads(1);
  const model::ModelConfig c = tiny_config();
  auto m = model::make_model(c, 99);
  model::LossConfig lc;
  lc.weight[model::kLossLmZ] = 1e-4;
  lc.weight[model::kLossMoeLb] = 0.01;
  lc.weight[model::kLossRouterZ] = 0.001;
  std::vector<std::string> out;
  {
    dist::ModelShards shards(comm, *m, mode);
    if (per_layer) *per_layer = shards.per_layer();
    AdamWConfig acfg;
    acfg.lr = 1e-3;
    acfg.weight_decay = 0.1;
    const int64_t N = comm.size();
    for (int64_t s = 1; s <= kSteps; ++s) {
      int64_t total = 0;
      for (int64_t l = 0; l < kLeaves; ++l) total += Leaf(s, l, c.vocab_size).trained_count;
      shards.bind_for_step();
      shards.begin_step(kLeaves / N);
      for (int64_t k = 0; k < kLeaves / N; ++k) {
        const Leaf leaf(s, shards.leaf_index(k), c.vocab_size);  // zero3: interleaved, dp: contiguous
        shards.begin_leaf();
        m->forward_backward(leaf.batch(), lc, 1.0 / double(total), 1.0 / double(kLeaves));
        shards.end_leaf();
      }
      shards.reduce();
      shards.release_params();
      const double norm = shards.params().grad_norm();
      shards.params().clip_and_step(acfg, 1.0, s, norm);
      char buf[64];
      std::snprintf(buf, sizeof buf, "step %lld norm %a", static_cast<long long>(s), norm);
      out.push_back(buf);
    }
    shards.finish();
  }
  uint64_t h = 1469598103934665603ull;
  for (auto& prm : m->params()) {
    const auto* b = reinterpret_cast<const unsigned char*>(prm.value.data<float>());
    for (size_t i = 0; i < size_t(prm.value.numel()) * 4; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "digest %016llx", static_cast<unsigned long long>(h));
  out.push_back(buf);
  return out;
}

using mpitest::MpiRun;
using mpitest::read_lines;

// mpirun -np N <this test binary> --gtest_filter=DistHybridWorker.Run, writing its digests to `out`.
MpiRun mpirun(int np, const std::string& out, const fs::path& scratch, int limit = 120) {
  return mpitest::mpirun_worker(np, "OLMOSFT_DIST_HYBRID_WORKER='" + out + "'", "DistHybridWorker.Run",
                                scratch, limit);
}

}  // namespace

// The worker: does nothing unless launched by DistHybrid.Zero3PerLayerMatchesUnshardedAt1To4Ranks.
TEST(DistHybridWorker, Run) {
  const char* env = std::getenv("OLMOSFT_DIST_HYBRID_WORKER");
  if (!env) GTEST_SKIP() << "only runs under mpirun, started by DistHybrid tests";
  auto comm = dist::make_comm();
  ASSERT_EQ(comm->name(), "mpi");
  bool per_layer = false;
  const auto lines = train_steps(*comm, dist::ShardMode::Sharded, &per_layer);
  EXPECT_TRUE(per_layer);
  if (comm->rank() == 0) {
    std::ofstream f(env);
    f << "per_layer " << per_layer << "\n";
    for (const auto& l : lines) f << l << "\n";
  }
}

TEST(DistHybrid, HonoursResidencyAndZero3PerLayerMatchesUnsharded) {
  if (dist::launched_under_mpi()) GTEST_SKIP();
  auto comm = dist::make_single_comm();
  bool per_layer_dp = true, per_layer_z3 = false;
  const auto ref = train_steps(*comm, dist::ShardMode::Replicated, &per_layer_dp);
  const auto z3 = train_steps(*comm, dist::ShardMode::Sharded, &per_layer_z3);
  EXPECT_FALSE(per_layer_dp);
  EXPECT_TRUE(per_layer_z3) << "the hybrid must honour the per-layer residency hooks";
  EXPECT_EQ(ref, z3);
  ASSERT_EQ(ref.size(), size_t(kSteps) + 1);
}

TEST(DistHybrid, Zero3PerLayerMatchesUnshardedAt1To4Ranks) {
  if (dist::launched_under_mpi()) GTEST_SKIP();
  auto comm = dist::make_single_comm();
  std::vector<std::string> ref = train_steps(*comm, dist::ShardMode::Replicated, nullptr);
  ref.insert(ref.begin(), "per_layer 1");
  const fs::path d = fs::temp_directory_path() / ("olmosft_dist_hybrid_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  for (int np : {1, 2, 4}) {
    const std::string out = (d / ("r" + std::to_string(np))).string();
    const MpiRun r = mpirun(np, out, d);
    ASSERT_EQ(r.rc, 0) << "mpirun -np " << np << " failed:\n" << r.log;
    EXPECT_EQ(read_lines(out), ref) << np << " ranks";
  }
  fs::remove_all(d);
}
