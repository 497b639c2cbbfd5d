// Hybrid (olmo3moe) benchmark.
//  1. Forward+backward tokens/s of the full D.2 "small" config (16 layers: 14 KDA + 2 attention, 64 experts
//     top-8, latent 128) on one packed row of T tokens, wall and process-CPU time; and the PyTorch reference
//     (tests/reference/model_olmo3moe.py --bench: recurrent KDA, every expert on every token, autograd)
//     on the same config and a shorter row (it is a per-token Python loop), with this code on that row too.
//  2. Peak memory of forward+backward of one row of T tokens through the D.2 tiny config at several T up
//     to 65,536, each in a fresh child process: VmHWM (peak RSS) and the activation bytes kept for the
//     backward (tracked), showing linear growth in T.
// Usage: bench_hybrid [--threads N] [--seq T] [--ref-seq T] [--no-torch] [--mem-max T]
//        bench_hybrid --child-mem T     (internal: one memory measurement)
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/threads.h"
#include "model/decoder.h"

using namespace olmosft;
using namespace olmosft::model;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Peak resident set size (kB) from /proc/self/status.
long vm_hwm_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

struct Row {
  std::vector<int32_t> tokens, seg, pos, targets;
  std::vector<uint8_t> trained;
  Row(int64_t T, int64_t V) {
    uint64_t s = 12345;
    for (int64_t t = 0; t < T; ++t) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      tokens.push_back(static_cast<int32_t>(2 + (s >> 33) % static_cast<uint64_t>(V - 2)));
      seg.push_back(1);
      pos.push_back(static_cast<int32_t>(t));
    }
    for (int64_t t = 0; t < T; ++t) {
      targets.push_back(t + 1 < T ? tokens[static_cast<size_t>(t + 1)] : -100);
      trained.push_back(t + 1 < T ? 1 : 0);
    }
  }
  Batch batch() const {
    Batch b;
    b.B = 1;
    b.T = static_cast<int64_t>(tokens.size());
    b.tokens = tokens.data();
    b.segments = seg.data();
    b.positions = pos.data();
    b.targets = targets.data();
    b.trained = trained.data();
    return b;
  }
};

LossConfig sft_loss() {
  LossConfig l;
  l.weight[model::kLossLmZ] = 1e-5;
  l.weight[model::kLossMoeLb] = 0.01;
  l.weight[model::kLossRouterZ] = 1e-5;
  return l;
}

struct Timing {
  double wall = 0, cpu = 0;
};

Timing time_fb(CausalLM& m, int64_t T, int reps) {
  Row r(T, m.config().vocab_size);
  const Batch b = r.batch();
  m.forward_backward(b, sft_loss(), 1.0 / static_cast<double>(T - 1), 1.0);  // warm-up
  Timing best{1e30, 1e30};
  for (int i = 0; i < reps; ++i) {
    const double w0 = now(), c0 = cpu_now();
    m.forward_backward(b, sft_loss(), 1.0 / static_cast<double>(T - 1), 1.0);
    best.wall = std::min(best.wall, now() - w0);
    best.cpu = std::min(best.cpu, cpu_now() - c0);
  }
  return best;
}

int child_mem(int64_t T) {
  auto cfg = parse_config(preset_config_json("olmo3moe-tiny"), "preset olmo3moe-tiny");
  auto m = make_decoder(cfg, 1);
  const long before = vm_hwm_kb();
  Row r(T, cfg.vocab_size);
  const double w0 = now();
  m->forward_backward(r.batch(), sft_loss(), 1.0 / static_cast<double>(T - 1), 1.0);
  const double wall = now() - w0;
  const auto* hm = dynamic_cast<Decoder*>(m.get());
  std::printf("%lld %ld %ld %zu %.3f\n", static_cast<long long>(T), before, vm_hwm_kb(),
              hm ? hm->last_run().saved_bytes : size_t{0}, wall);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  int64_t seq = 1024, ref_seq = 256, mem_max = 65536;
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--child-mem") {
      set_threads(threads);
      return child_mem(std::atoll(next()));
    } else if (a == "--threads") {
      threads = std::atoi(next());
    } else if (a == "--seq") {
      seq = std::atoll(next());
    } else if (a == "--ref-seq") {
      ref_seq = std::atoll(next());
    } else if (a == "--mem-max") {
      mem_max = std::atoll(next());
    } else if (a == "--no-torch") {
      torch = false;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  set_threads(threads);
  auto cfg = parse_config(preset_config_json("olmo3moe-d2small"), "preset olmo3moe-d2small");
  auto m = make_decoder(cfg, 1);
  std::printf(
      "## bench_hybrid: olmo3moe D.2 small (%lld layers, d=%lld, %lld experts top-%lld), threads %d\n\n",
      static_cast<long long>(cfg.num_hidden_layers), static_cast<long long>(cfg.hidden_size),
      static_cast<long long>(cfg.n_routed_experts), static_cast<long long>(cfg.num_experts_per_tok), threads);
  std::printf(
      "| implementation | T | fwd+bwd wall s | tokens/s (wall) | CPU s | tokens/CPU-s "
      "|\n|---|---|---|---|---|---|\n");
  for (int64_t T : {ref_seq, seq}) {
    Timing t = time_fb(*m, T, 2);
    std::printf("| olmosft C++ (chunk 64) | %lld | %.3f | %.2f | %.3f | %.2f |\n", static_cast<long long>(T),
                t.wall, static_cast<double>(T) / t.wall, t.cpu, static_cast<double>(T) / t.cpu);
    std::fflush(stdout);
  }
  if (torch) {
    const std::string cfgpath = (std::filesystem::temp_directory_path() /
                                 ("olmosft_bench_hybrid_" + std::to_string(getpid()) + ".json"))
                                    .string();
    {
      std::ofstream f(cfgpath);
      auto j = preset_config_json("olmo3moe-d2small");
      j["eos_token_id"] = 1;
      f << j.dump();
    }
    const std::string cmd = std::string("/usr/bin/python3 ") + OLMOSFT_SOURCE_DIR +
                            "/tests/reference/model_olmo3moe.py --bench " + cfgpath + " --tokens " +
                            std::to_string(ref_seq) + " --reps 1 --threads " + std::to_string(threads) +
                            " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (p && fgets(buf, sizeof buf, p)) out += buf;
    const int rc = p ? pclose(p) : -1;
    std::filesystem::remove(cfgpath);
    const auto k = out.find("\"best_s\": ");
    if (rc == 0 && k != std::string::npos) {
      const double s = std::atof(out.c_str() + k + 10);
      std::printf(
          "| PyTorch reference (recurrent KDA, dense experts, autograd) | %lld | %.3f | %.2f | - | - |\n",
          static_cast<long long>(ref_seq), s, static_cast<double>(ref_seq) / s);
    } else {
      std::printf("\n(PyTorch reference not run: %s)\n", out.substr(0, 300).c_str());
    }
  }
  std::printf("\n## Peak memory, D.2 tiny, one row of T tokens, forward+backward (fresh process each)\n\n");
  std::printf(
      "| T | peak RSS MiB | RSS before MiB | saved activations MiB | saved bytes / token | wall s "
      "|\n|---|---|---|---|---|---|\n");
  for (int64_t T = 8192; T <= mem_max; T *= 2) {
    const std::string cmd =
        std::string(argv[0]) + " --threads " + std::to_string(threads) + " --child-mem " + std::to_string(T);
    FILE* p = popen(cmd.c_str(), "r");
    long long tt = 0;
    long before = 0, peak = 0;
    size_t saved = 0;
    double wall = 0;
    const int n = p ? std::fscanf(p, "%lld %ld %ld %zu %lf", &tt, &before, &peak, &saved, &wall) : 0;
    if (p) pclose(p);
    if (n != 5) {
      std::printf("| %lld | (child failed) | | | | |\n", static_cast<long long>(T));
      continue;
    }
    std::printf("| %lld | %.1f | %.1f | %.1f | %.0f | %.2f |\n", tt, peak / 1024.0, before / 1024.0,
                static_cast<double>(saved) / 1048576.0, static_cast<double>(saved) / static_cast<double>(tt),
                wall);
    std::fflush(stdout);
  }
  return 0;
}
