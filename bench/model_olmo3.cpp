// Olmo 3 dense training-step benchmark: forward + backward tokens/s of the D.1 small config (vocab 4096,
// hidden 256, 8 layers 3:1, heads 8, kv 4, head_dim 32, intermediate 704, window 64) on one packed row of
// T tokens (default 2048, 4 documents), then the same step in the PyTorch reference
// (`/usr/bin/python3 tests/reference/model_olmo3.py --bench`, float32 autograd with materialised masks) when
// /usr/bin/python3 has torch. Reports wall and CPU seconds per step, the ratio, and achieved GFLOP/s against
// the 2-core fp32 peak (~200 GFLOP/s, anchors.md §2.1).
// Usage: bench_model_olmo3 [--threads N] [--iters K] [--seq T] [--docs D] [--no-torch]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "core/threads.h"
#include "model/decoder.h"
#include "model/model.h"

using namespace olmosft;
using namespace olmosft::model;
using bench::cpu_now;
using bench::now;

int main(int argc, char** argv) {
  int threads = 2, iters = 3, docs = 4;
  int64_t T = 2048;
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seq" && i + 1 < argc)
      T = std::max<int64_t>(8, std::atoll(argv[++i]));
    else if (a == "--docs" && i + 1 < argc)
      docs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--no-torch")
      torch = false;
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--iters K] [--seq T] [--docs D] [--no-torch]\n",
                   argv[0]);
      return 2;
    }
  }
  set_threads(threads);
  const int nt = num_threads();
  ModelConfig c = parse_config(preset_config_json("olmo3-small"), "olmo3-small preset");
  auto m = make_model(c, 1);

  // One packed row: `docs` documents (the last absorbs the remainder), every next token trained.
  std::vector<int64_t> lens(static_cast<size_t>(docs), T / docs);
  lens.back() += T - (T / docs) * docs;
  std::vector<int32_t> tok(static_cast<size_t>(T)), seg(static_cast<size_t>(T)), pos(static_cast<size_t>(T)),
      tgt(static_cast<size_t>(T), -100);
  std::vector<uint8_t> trained(static_cast<size_t>(T), 0);
  Rng r{7, 0};
  int64_t t0 = 0;
  for (int d = 0; d < docs; ++d) {
    for (int64_t j = 0; j < lens[size_t(d)]; ++j) {
      tok[size_t(t0 + j)] = int32_t(r.below(uint64_t(t0 + j), uint64_t(c.vocab_size)));
      seg[size_t(t0 + j)] = d;
      pos[size_t(t0 + j)] = int32_t(j);
    }
    for (int64_t j = 0; j + 1 < lens[size_t(d)]; ++j) {
      tgt[size_t(t0 + j)] = tok[size_t(t0 + j + 1)];
      trained[size_t(t0 + j)] = 1;
    }
    t0 += lens[size_t(d)];
  }
  Batch b;
  b.B = 1;
  b.T = T;
  b.tokens = tok.data();
  b.segments = seg.data();
  b.positions = pos.data();
  b.targets = tgt.data();
  b.trained = trained.data();
  LossConfig lc;
  lc.weight[model::kLossLmZ] = 1e-5;
  int64_t ntr = 0;
  for (auto x : trained) ntr += x;

  // Model FLOPs per step (the usual 6 * matmul params per token + 12 * visible pairs * head_dim * heads
  // per attention layer for forward + backward; the backward's recomputation of q/k and of the attention
  // probabilities is not counted, as in MFU conventions).
  const int64_t d = c.hidden_size, HD = c.num_attention_heads * c.head_dim,
                KD = c.num_key_value_heads * c.head_dim, F = c.intermediate_size;
  const double mm_params =
      double(c.num_hidden_layers) * double(d * (HD + 2 * KD) + HD * d + 3 * d * F) + double(c.vocab_size * d);
  double attn_flops = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool sliding = c.layer_types[size_t(l)] == LayerType::SlidingAttention;
    for (auto L : lens)
      attn_flops += 12.0 * bench::causal_pairs(L, sliding ? c.sliding_window : 0) *
                    double(c.head_dim * c.num_attention_heads);
  }
  const double flops = 6.0 * mm_params * double(T) + attn_flops;

  m->forward_backward(b, lc, 1.0 / double(ntr), 1.0);  // warm-up (allocates the workspace)
  const double w0 = now(), c0 = cpu_now();
  for (int i = 0; i < iters; ++i) m->forward_backward(b, lc, 1.0 / double(ntr), 1.0);
  const double wall = (now() - w0) / iters, cpu = (cpu_now() - c0) / iters;
  auto* o3 = dynamic_cast<Decoder*>(m.get());
  std::printf("## bench_model_olmo3: Olmo 3 D.1 small, forward+backward, 1 row x T=%lld (%d documents)\n\n",
              (long long)T, docs);
  std::printf(
      "- threads %d; %lld trained targets; model FLOPs/step %.3g (6 x %.3g matmul params x T + attention "
      "%.3g)\n",
      nt, (long long)ntr, flops, mm_params, attn_flops);
  std::printf("- workspace %.1f MiB (saved %.1f MiB)\n\n", double(o3->workspace_bytes()) / 1048576.0,
              double(o3->last_run().saved_bytes) / 1048576.0);
  std::printf("| impl | s/step (wall) | CPU s/step | tokens/s | GFLOP/s (wall) | %% of 2-core peak 200 |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::printf("| olmosft | %.3f | %.3f | %.0f | %.1f | %.0f%% |\n", wall, cpu, double(T) / wall,
              flops / wall / 1e9, 100.0 * flops / wall / 200e9);
  std::fflush(stdout);
  if (!torch) return 0;
  const char* py = "/usr/bin/python3";
  const std::string script = std::string(OLMOSFT_SOURCE_DIR) + "/tests/reference/model_olmo3.py";
  const std::string cmd = std::string(py) + " " + script + " --bench --T " + std::to_string(T) + " --docs " +
                          std::to_string(docs) + " --iters " + std::to_string(iters) + " --threads " +
                          std::to_string(nt) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    std::printf("\n(PyTorch reference not run: popen failed)\n");
    return 0;
  }
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  double tw = 0, tc = 0;
  auto num = [&](const char* key, double& v) {
    auto k = out.find(std::string("\"") + key + "\": ");
    if (k == std::string::npos) return false;
    v = std::atof(out.c_str() + k + std::strlen(key) + 4);
    return true;
  };
  if (rc != 0 || !num("sec_per_step", tw) || !num("cpu_sec_per_step", tc)) {
    std::printf("\n(PyTorch reference not available: %s)\n", out.substr(0, 300).c_str());
    return 0;
  }
  std::printf("| PyTorch reference (torch, %d threads) | %.3f | %.3f | %.0f | %.1f | %.0f%% |\n", nt, tw, tc,
              double(T) / tw, flops / tw / 1e9, 100.0 * flops / tw / 200e9);
  std::printf("\nolmosft / PyTorch speed ratio: %.2fx (wall), %.2fx (CPU time)\n", tw / wall, tc / cpu);
  return 0;
}
