// `make bench` -> build/bench_dist: the distributed engine on the toy MLP (tests/unit/dist/dist_toy.h).
// Without mpirun it re-launches itself as `mpirun -np N` for N = 1 and 2 (shared-memory transport),
// and prints a markdown table: step time (wall and per-rank CPU), scaling 1 -> 2 processes, and the
// bytes each rank sent per step against the theoretical minimum of each mode:
//   DP     : all-reduce of the gradients, 2 (N-1)/N x B   (B = padded parameter bytes)
//   ZeRO-3 : all-gather x 2 (forward, backward) + reduce-scatter = 3 (N-1)/N x B
// The toy's first layer needs no weights in backward, so ZeRO-3 measures AG(fc1) + 2 AG(fc2) + RS,
// reported next to the 3 (N-1)/N bound; small extras (loss, grad-norm partials) are included.
// Options (env): OLMOSFT_BENCH_DIST="in=512;hidden=1024;classes=64;batch=64;steps=6".
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "../tests/unit/dist/dist_toy.h"
#include "dist/comm.h"
#include "dist/sharded.h"

using namespace olmosft;
using namespace olmosft::dist;

namespace {
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
std::map<std::string, std::string> opts() {
  std::map<std::string, std::string> m{
      {"in", "512"}, {"hidden", "1024"}, {"classes", "64"}, {"batch", "64"}, {"steps", "6"}};
  if (const char* e = std::getenv("OLMOSFT_BENCH_DIST")) {
    std::stringstream ss(e);
    for (std::string kv; std::getline(ss, kv, ';');)
      if (auto eq = kv.find('='); eq != std::string::npos) m[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return m;
}

int worker() {
  auto comm = make_comm();
  auto o = opts();
  ToyConfig c;
  c.in = std::stoll(o["in"]);
  c.hidden = std::stoll(o["hidden"]);
  c.classes = std::stoll(o["classes"]);
  c.global_batch = std::stoll(o["batch"]);
  c.leaves = 2;
  const int steps = std::stoi(o["steps"]);
  const int N = comm->size();
  for (ShardMode mode : {ShardMode::Replicated, ShardMode::Sharded}) {
    ShardedParams sp(*comm, toy_specs(c), mode);
    sp.init([&](const TensorSpec& s, float* f) { toy_init(c, s, f); });
    toy_train_step(*comm, sp, c, 1);  // warm-up
    comm->barrier();
    comm->reset_stats();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    double loss = 0;
    for (int s = 2; s < 2 + steps; ++s) loss = toy_train_step(*comm, sp, c, s).loss;
    comm->barrier();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
    const double cpu = (cpu_now() - c0) / steps;
    const CommStats st = comm->stats();
    // B: padded parameter bytes of the whole model (what one all-reduce / all-gather moves).
    int64_t B = 0;
    {
      ShardedParams one(*comm, toy_specs(c), mode);
      B = mode == ShardMode::Sharded ? one.memory().persistent_bytes / 4 * N
                                     : one.memory().persistent_bytes / 4;
    }
    const double factor = mode == ShardMode::Sharded ? 3.0 : 2.0;
    const double theory = factor * double(N - 1) / double(N) * double(B);
    const double sent = double(st.total()) / steps;
    const MemoryStats mem = sp.memory();
    if (comm->rank() == 0)
      std::printf("| %s | %d | %.1f | %.1f | %.3f | %.3f | %.3f | %s | %.2f | %.2f |\n", mode_name(mode), N,
                  wall * 1e3, cpu * 1e3, double(B) / 1e6, sent / 1e6, theory / 1e6,
                  theory > 0 ? (std::to_string(sent / theory).substr(0, 5)).c_str() : "-",
                  double(mem.persistent_bytes) / 1e6, double(mem.peak_transient_bytes) / 1e6);
    std::fflush(stdout);
    (void)loss;
  }
  return 0;
}
}  // namespace

int main() {
  try {
    if (launched_under_mpi()) return worker();
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    auto o = opts();
    std::printf(
        "Toy MLP in=%s hidden=%s classes=%s, global batch %s rows, %s timed steps after 1 warm-up; "
        "one process per rank on this machine (mpirun, btl self,vader).\n\n",
        o["in"].c_str(), o["hidden"].c_str(), o["classes"].c_str(), o["batch"].c_str(), o["steps"].c_str());
    std::printf(
        "| mode | ranks | step ms (wall) | CPU ms/step (rank 0) | model MB (B) | sent MB/step/rank | "
        "theory MB | sent/theory | state MB/rank | peak transient MB |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
    for (int np : {1, 2}) {
      const std::string cmd =
          "OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none "
          "timeout -s KILL 300 mpirun --oversubscribe --allow-run-as-root -np " +
          std::to_string(np) + " " + self;
      const int st = std::system(cmd.c_str());
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        std::fprintf(stderr, "bench_dist: mpirun -np %d failed (status %d)\n", np, st);
        return 1;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dist: %s\n", e.what());
    return 1;
  }
}
