// Tests of src/dist: deterministic collectives, sharded parameter state, checkpoints and failure
// handling. Multi-rank tests re-launch this executable under mpirun (1, 2 and 4 ranks on one machine,
// shared-memory transport only) with the worker test DistWorker.Run, which is skipped otherwise.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "dist/sharded.h"
#include "dist_toy.h"
#include "io/hash.h"
#include "mpi_test_util.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using namespace olmosft;
using namespace olmosft::dist;

namespace {

// The model used by every multi-rank test: big enough that ZeRO-3 padding is small (memory ~1/N).
ToyConfig test_config() {
  ToyConfig c;
  c.in = 128;
  c.hidden = 256;
  c.classes = 8;
  c.global_batch = 32;
  c.leaves = 4;
  return c;
}

std::string hexd(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", v);
  return b;
}

std::string param_digest(ShardedParams& sp) {
  std::string all;
  for (size_t t = 0; t < sp.specs().size(); ++t) {
    auto v = sp.full_param(int(t));
    all.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  return io::sha256_hex(all);
}

// Runs steps [first, last] and returns one line per step: "step loss norm" (hex floats).
std::vector<std::string> run_steps(Comm& comm, ShardedParams& sp, const ToyConfig& c, int64_t first,
                                   int64_t last) {
  std::vector<std::string> out;
  for (int64_t s = first; s <= last; ++s) {
    auto r = toy_train_step(comm, sp, c, s);
    out.push_back(std::to_string(s) + " " + hexd(r.loss) + " " + hexd(r.grad_norm));
  }
  return out;
}

std::map<std::string, std::string> parse_args(const std::string& s) {
  std::map<std::string, std::string> m;
  std::stringstream ss(s);
  std::string kv;
  while (std::getline(ss, kv, ';')) {
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    m[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
  }
  return m;
}

using mpitest::MpiRun;
using mpitest::read_lines;

// mpirun -np N <this test binary> --gtest_filter=DistWorker.Run with OLMOSFT_DIST_WORKER=args.
MpiRun mpirun(int np, const std::string& args, const std::string& scratch, int limit = 60) {
  return mpitest::mpirun_worker(np, "OLMOSFT_DIST_WORKER='" + args + "'", "DistWorker.Run", scratch, limit);
}

fs::path scratch_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("olmosft_dist_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Reference: the same training in this process with the single-process Comm.
std::vector<std::string> reference_losses(ShardMode mode, int64_t steps, std::string* digest = nullptr) {
  auto comm = make_single_comm();
  const ToyConfig c = test_config();
  ShardedParams sp(*comm, toy_specs(c), mode);
  sp.init([&](const TensorSpec& s, float* f) { toy_init(c, s, f); });
  auto v = run_steps(*comm, sp, c, 1, steps);
  if (digest) *digest = param_digest(sp);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The worker: does nothing unless launched by the tests below under mpirun.
TEST(DistWorker, Run) {
  const char* env = std::getenv("OLMOSFT_DIST_WORKER");
  if (!env) GTEST_SKIP() << "only runs under mpirun, started by the DistMpi tests";
  auto a = parse_args(env);
  auto comm = make_comm();
  ASSERT_EQ(comm->name(), "mpi");
  if (a.count("timeout")) comm->set_timeout_seconds(std::stod(a["timeout"]));
  const ToyConfig c = test_config();
  const int64_t first = a.count("first") ? std::stoll(a["first"]) : 1, last = std::stoll(a["last"]);
  const int die_rank = a.count("die_rank") ? std::stoi(a["die_rank"]) : -1;
  const int64_t die_step = a.count("die_step") ? std::stoll(a["die_step"]) : -1;
  for (const std::string mode : {"dp", "zero3"}) {
    if (a.count("mode") && a["mode"] != mode) continue;
    ShardedParams sp(*comm, toy_specs(c), parse_mode(mode));
    sp.init([&](const TensorSpec& s, float* f) { toy_init(c, s, f); });
    if (a.count("load")) {
      ASSERT_EQ(train::load_checkpoint_sharded(a["load"], sp).step + 1, first);
    }
    std::vector<std::string> lines;
    for (int64_t s = first; s <= last; ++s) {
      if (comm->rank() == die_rank && s == die_step) {
        if (a["die_how"] == "kill") std::raise(SIGKILL);
        std::this_thread::sleep_for(std::chrono::seconds(600));  // "hang": never joins the collective
      }
      auto v = run_steps(*comm, sp, c, s, s);
      lines.push_back(v[0]);
      if (a.count("save") && s == std::stoll(a["save_at"]))
        train::save_checkpoint_sharded(a["save"], sp, {s}, "", 1);
    }
    const std::string digest = param_digest(sp);
    const MemoryStats mem = sp.memory();
    const std::string out = a["out"] + "." + mode;
    std::ofstream(out + ".mem." + std::to_string(comm->rank()))
        << mem.persistent_bytes << " " << mem.peak_transient_bytes << " " << mem.padding_elements << "\n";
    if (comm->rank() == 0) {
      std::ofstream f(out);
      for (auto& l : lines) f << l << "\n";
      f << "digest " << digest << "\n";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Single-process tests.

TEST(DistComm, TreeSumMatchesPairwiseSum) {
  for (int count : {1, 2, 3, 4, 8}) {
    const int64_t n = 37;
    std::vector<std::vector<float>> leaves(static_cast<size_t>(count), std::vector<float>(size_t(n)));
    Rng rng{7, uint64_t(count)};
    for (int l = 0; l < count; ++l)
      for (int64_t i = 0; i < n; ++i)
        leaves[size_t(l)][size_t(i)] = rng.normal(uint64_t(l * n + i)) * float(1 << (i % 20));
    std::vector<const float*> ptrs;
    PairwiseSum acc(n);
    for (auto& l : leaves) ptrs.push_back(l.data()), acc.push(l.data());
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    tree_sum(ptrs.data(), count, a.data(), n);
    acc.finish(b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(n) * 4)) << count << " leaves";
    if (count == 4) {  // perfect tree: (l0+l1)+(l2+l3)
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(a[size_t(i)], (leaves[0][size_t(i)] + leaves[1][size_t(i)]) +
                                    (leaves[2][size_t(i)] + leaves[3][size_t(i)]));
    }
  }
}

TEST(DistComm, SingleProcessCollectives) {
  auto c = make_single_comm();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<float> x{1, 2, 3}, y(3);
  c->all_reduce_sum(x.data(), 3);
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  c->reduce_scatter_sum(x.data(), y.data(), 3);
  EXPECT_EQ(y, x);
  c->all_gather(x.data(), y.data(), 3);
  EXPECT_EQ(y, x);
  EXPECT_TRUE(c->all_ok(true));
  EXPECT_FALSE(c->all_ok(false));
  EXPECT_THROW(c->broadcast(x.data(), 4, 1), Error);
  EXPECT_THROW(c->set_timeout_seconds(0), Error);
}

TEST(DistComm, FactoryPicksSingleWithoutMpirun) {
  if (launched_under_mpi()) GTEST_SKIP();
  auto c = make_comm();
  EXPECT_EQ(c->name(), "single");
  setenv("OLMOSFT_DIST_TIMEOUT_S", "abc", 1);
  EXPECT_THROW(make_comm(), Error);
  setenv("OLMOSFT_DIST_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(make_comm()->timeout_seconds(), 2.5);
  unsetenv("OLMOSFT_DIST_TIMEOUT_S");
}

TEST(DistSharded, SpecValidation) {
  auto c = make_single_comm();
  EXPECT_THROW(ShardedParams(*c, {}, ShardMode::Sharded), Error);
  EXPECT_THROW(ShardedParams(*c, {{"a", {2}, 0}, {"a", {2}, 0}}, ShardMode::Sharded), Error);
  EXPECT_THROW(ShardedParams(*c, {{"a", {2}, 1}}, ShardMode::Sharded), Error);  // unit 0 empty
  EXPECT_THROW(ShardedParams(*c, {{"a", {0}, 0}}, ShardMode::Sharded), Error);
  EXPECT_THROW(parse_mode("fsdp2"), Error);
}

// The segmented AdamW on the flat buffers equals kernels/adamw.h applied to whole tensors.
TEST(DistSharded, StepMatchesKernelAdamW) {
  auto c = make_single_comm();
  std::vector<TensorSpec> specs{{"w", {7, 50}, 0, true}, {"b", {7}, 0, false}, {"u", {300}, 1, true}};
  for (ShardMode mode : {ShardMode::Replicated, ShardMode::Sharded}) {
    ShardedParams sp(*c, specs, mode);
    std::vector<std::vector<float>> p(3), g(3), m(3), v(3);
    Rng rng{3, 0};
    for (size_t t = 0; t < 3; ++t) {
      const int64_t n = specs[t].numel();
      p[t].resize(size_t(n)), g[t].resize(size_t(n)), m[t].assign(size_t(n), 0), v[t].assign(size_t(n), 0);
      for (int64_t i = 0; i < n; ++i)
        p[t][size_t(i)] = rng.normal(uint64_t(t * 1000 + i)),
        g[t][size_t(i)] = rng.normal(uint64_t(t * 1000 + i + 500));
      sp.set_param(int(t), p[t].data());
    }
    AdamWConfig cfg;
    cfg.lr = 0.01;
    cfg.weight_decay = 0.1;
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<AdamWParam<float>> ref;
      for (size_t t = 0; t < 3; ++t) {
        std::copy(g[t].begin(), g[t].end(), sp.grad(int(t)));
        ref.push_back({p[t].data(), g[t].data(), m[t].data(), v[t].data(), specs[t].numel(), specs[t].decay});
      }
      std::vector<std::vector<float>> gref = g;
      for (size_t t = 0; t < 3; ++t) ref[t].g = gref[t].data();
      sp.reduce_grads(0);
      sp.reduce_grads(1);
      const double n1 = sp.clip_and_step(cfg, 5.0, step);
      const double n2 = clip_grad_norm(ref, 5.0);
      adamw_step(ref, cfg, step);
      EXPECT_NEAR(n1, n2, 1e-12 * n2);  // different (but fixed) summation blocking
      for (size_t t = 0; t < 3; ++t) {
        EXPECT_EQ(sp.full_param(int(t)), p[t]) << mode_name(mode) << " tensor " << t << " step " << step;
        EXPECT_EQ(sp.full_moment(int(t), 1), v[t]);
      }
    }
  }
}

TEST(DistToy, TrainsAndModesAgreeInProcess) {
  std::string d1, d2;
  auto dp = reference_losses(ShardMode::Replicated, 30, &d1);
  auto z3 = reference_losses(ShardMode::Sharded, 30, &d2);
  EXPECT_EQ(dp, z3);
  EXPECT_EQ(d1, d2);
  auto loss = [&](size_t i) { return std::strtod(dp[i].substr(dp[i].find(' ') + 1).c_str(), nullptr); };
  double first = 0, last = 0;
  for (size_t i = 0; i < 5; ++i) first += loss(i), last += loss(25 + i);
  EXPECT_LT(last, 0.7 * first) << "the toy model does not learn: mean loss of steps 1-5 " << first / 5
                               << ", of steps 26-30 " << last / 5;
}

TEST(DistSharded, MemoryIsAboutOneOverN) {
  // One process: the persistent state is 4 buffers of the kAlign-padded units. The per-rank figures
  // under N ranks are measured in DistMpi.LossesMatch1To4Ranks.
  auto comm = make_single_comm();
  ShardedParams sp(*comm, toy_specs(test_config()), ShardMode::Replicated);
  const int64_t n = 128 * 256 + 256 + 8 * 256 + 8;
  EXPECT_LE(sp.memory().persistent_bytes, 16 * (n + 2 * ShardedParams::kAlign));
}

// ---------------------------------------------------------------------------------------------
// Multi-process tests (mpirun on this machine).

TEST(DistMpi, LossesMatch1To4Ranks) {
  const fs::path d = scratch_dir("match");
  std::string digest;
  const auto ref = reference_losses(ShardMode::Replicated, 6, &digest);
  std::map<int, int64_t> persistent;
  for (int np : {1, 2, 4}) {
    auto r = mpirun(np, "last=6;out=" + (d / ("r" + std::to_string(np))).string(), d.string());
    ASSERT_EQ(r.rc, 0) << r.log;
    for (const std::string mode : {"dp", "zero3"}) {
      auto lines = read_lines((d / ("r" + std::to_string(np) + "." + mode)).string());
      ASSERT_EQ(lines.size(), ref.size() + 1) << mode << " np=" << np;
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_EQ(lines[i], ref[i]) << mode << " np=" << np << " step " << i + 1;
      EXPECT_EQ(lines.back(), "digest " + digest) << mode << " np=" << np << ": final parameters differ";
      for (int rank = 0; rank < np; ++rank) {
        auto mem = read_lines(
            (d / ("r" + std::to_string(np) + "." + mode + ".mem." + std::to_string(rank))).string());
        ASSERT_EQ(mem.size(), 1u);
        const int64_t bytes = std::stoll(mem[0]);
        std::printf("[dist] mode=%s ranks=%d rank=%d persistent(params+grads+m+v)=%lld bytes (%s)\n",
                    mode.c_str(), np, rank, (long long)bytes, mem[0].c_str());
        if (mode == "zero3") {
          if (np == 1) persistent[1] = bytes;
          if (np > 1 && persistent.count(1)) {
            const double ratio = double(bytes) / double(persistent[1]);
            EXPECT_LE(ratio, 1.05 / np) << "rank " << rank << " of " << np;
            EXPECT_GE(ratio, 0.95 / np);
          }
        } else if (np > 1) {
          EXPECT_EQ(bytes, std::stoll(read_lines((d / "r1.dp.mem.0").string())[0]));  // replicated
        }
      }
    }
    std::printf("[dist] mpirun -np %d: %.2f s\n", np, r.seconds);
  }
  fs::remove_all(d);
}

TEST(DistMpi, SaveOn4ResumeOn2) {
  const fs::path d = scratch_dir("resume");
  const auto ref = reference_losses(ShardMode::Sharded, 6);
  const std::string root = (d / "ckpt").string(), ck = root + "/" + train::checkpoint_dir_name(3);
  auto a = mpirun(4, "mode=zero3;last=3;save_at=3;save=" + root + ";out=" + (d / "a").string(), d.string());
  ASSERT_EQ(a.rc, 0) << a.log;
  auto b = mpirun(2, "mode=zero3;first=4;last=6;load=" + ck + ";out=" + (d / "b").string(), d.string());
  ASSERT_EQ(b.rc, 0) << b.log;
  auto la = read_lines((d / "a.zero3").string()), lb = read_lines((d / "b.zero3").string());
  ASSERT_EQ(la.size(), 4u);
  ASSERT_EQ(lb.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(la[size_t(i)], ref[size_t(i)]) << "step " << i + 1;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lb[size_t(i)], ref[size_t(i + 3)]) << "resumed step " << i + 4;
  // The same checkpoint also resumes in data-parallel mode on 1 process.
  auto comm = make_single_comm();
  const ToyConfig c = test_config();
  ShardedParams sp(*comm, toy_specs(c), ShardMode::Replicated);
  EXPECT_EQ(train::load_checkpoint_sharded(ck, sp).step, 3);
  auto lc = run_steps(*comm, sp, c, 4, 6);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lc[size_t(i)], ref[size_t(i + 3)]);
  fs::remove_all(d);
}

TEST(DistMpi, KilledRankEndsJobNonZero) {
  const fs::path d = scratch_dir("kill");
  auto r =
      mpirun(2, "mode=zero3;last=6;die_rank=1;die_step=3;die_how=kill;timeout=20;out=" + (d / "k").string(),
             d.string(), 60);
  std::printf("[dist] killed rank: job exit %d after %.2f s\n", r.rc, r.seconds);
  EXPECT_NE(r.rc, 0) << r.log;
  // mpirun reports the dead rank and exits 137 (128 + SIGKILL); the outer `timeout` would also give
  // 137, so the elapsed time and mpirun's message tell them apart.
  EXPECT_LT(r.seconds, 30) << r.log;
  EXPECT_NE(r.log.find("exited on signal 9"), std::string::npos) << r.log;
  fs::remove_all(d);
}

TEST(DistMpi, HungRankEndsJobByWatchdog) {
  const fs::path d = scratch_dir("hang");
  auto r = mpirun(2, "mode=dp;last=6;die_rank=1;die_step=2;die_how=hang;timeout=5;out=" + (d / "h").string(),
                  d.string(), 60);
  std::printf("[dist] hung rank: job exit %d after %.2f s\n", r.rc, r.seconds);
  EXPECT_EQ(r.rc, kAbortExitCode) << r.log;
  EXPECT_NE(r.log.find("did not complete within"), std::string::npos) << r.log;
  EXPECT_LT(r.seconds, 30) << r.log;
  fs::remove_all(d);
}
