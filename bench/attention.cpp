// Attention kernel benchmark: forward + backward tokens/s for one packed row of T = 4096 tokens, H = 4,
// Hkv = 2, D = Dv = 64, full causal and sliding window 1024, both tile backends; then the same shapes in
// PyTorch (bench/attention_torch.py, materialised-mask attention + autograd) if /usr/bin/python3 has torch.
// Usage: bench_attention [--threads N] [--reps R] [--seq T] [--no-torch]
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "core/threads.h"

using namespace olmosft;
using bench::cpu_now;
using bench::now;

int main(int argc, char** argv) {
  int threads = 0, reps = 3;
  int64_t T = 4096;
  bool torch = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seq" && i + 1 < argc)
      T = std::atoll(argv[++i]);
    else if (a == "--no-torch")
      torch = false;
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps R] [--seq T] [--no-torch]\n", argv[0]);
      return 2;
    }
  }
  set_threads(threads);
  const int nt = num_threads();
  AttentionConfig c;
  c.seq = T;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.v_head_dim = 64;
  c.scale = 1.0 / 8.0;
  c.threads = nt;
  std::vector<float> q(T * c.heads * c.head_dim), k(T * c.kv_heads * c.head_dim),
      v(T * c.kv_heads * c.v_head_dim), o(T * c.heads * c.v_head_dim), lse(c.heads * T), dout(o.size()),
      dq(q.size()), dk(k.size()), dv(v.size());
  Rng r{42, 0};
  for (size_t i = 0; i < q.size(); ++i) q[i] = r.normal(i);
  for (size_t i = 0; i < k.size(); ++i) k[i] = r.normal(i + q.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = r.normal(i + 2 * q.size());
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = r.normal(i + 3 * q.size());
  std::vector<int32_t> seg(T, 0);

  std::printf("attention bench: T=%lld H=%lld Hkv=%lld D=%lld threads=%d reps=%d (best of reps)\n",
              (long long)T, (long long)c.heads, (long long)c.kv_heads, (long long)c.head_dim, nt, reps);
  std::printf(
      "GFLOP/s counts fwd = 4*pairs*D*H, bwd = 10*pairs*D*H (FlashAttention convention, bwd includes "
      "the recompute of QK^T)\n");
  std::printf(
      "wall: elapsed time; cpu: process CPU time (sum over threads; equals the running time with 1 "
      "thread on a busy machine)\n");
  std::printf("%-10s %-6s %9s %9s %12s %10s %10s %9s %9s %14s\n", "mask", "tiles", "fwd ms", "bwd ms",
              "fwd+bwd tok/s", "fwd GF/s", "bwd GF/s", "fwd cpu", "bwd cpu", "tok/cpu-s");
  for (int64_t W : {int64_t{0}, int64_t{1024}}) {
    c.window = W;
    const double pairs = bench::causal_pairs(T, W);
    std::vector<std::byte> wf(attention_forward_workspace_bytes<float>(c)),
        wb(attention_backward_workspace_bytes<float>(c));
    for (auto backend : {AttentionTileBackend::kBlas, AttentionTileBackend::kLoops}) {
      set_attention_tile_backend(backend);
      double best_f = 1e30, best_b = 1e30, cpu_f = 1e30, cpu_b = 1e30;
      for (int rep = 0; rep <= reps; ++rep) {  // rep 0 is a warm-up
        double c0 = cpu_now(), t0 = now();
        attention_forward<float>(c, q.data(), k.data(), v.data(), seg.data(), o.data(), lse.data(), wf.data(),
                                 wf.size());
        double c1 = cpu_now(), t1 = now();
        attention_backward<float>(c, q.data(), k.data(), v.data(), seg.data(), o.data(), lse.data(),
                                  dout.data(), dq.data(), dk.data(), dv.data(), wb.data(), wb.size());
        double c2 = cpu_now(), t2 = now();
        if (rep > 0) {
          best_f = std::min(best_f, t1 - t0);
          best_b = std::min(best_b, t2 - t1);
          cpu_f = std::min(cpu_f, c1 - c0);
          cpu_b = std::min(cpu_b, c2 - c1);
        }
      }
      const double hd = double(c.heads) * c.head_dim;
      std::printf("%-10s %-6s %9.2f %9.2f %12.0f %10.1f %10.1f %9.2f %9.2f %14.0f\n",
                  W > 0 ? "win1024" : "full", backend == AttentionTileBackend::kBlas ? "blas" : "loops",
                  best_f * 1e3, best_b * 1e3, T / (best_f + best_b), 4 * pairs * hd / best_f * 1e-9,
                  10 * pairs * hd / best_b * 1e-9, cpu_f * 1e3, cpu_b * 1e3, T / (cpu_f + cpu_b));
    }
  }
  set_attention_tile_backend(AttentionTileBackend::kBlas);
  std::fflush(stdout);

  if (!torch) return 0;
  const char* script = OLMOSFT_SOURCE_DIR "/bench/attention_torch.py";
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    std::printf("torch: skipped (/usr/bin/python3 with torch not found)\n");
    return 0;
  }
  const std::string cmd = std::string("/usr/bin/python3 ") + script + " --threads " + std::to_string(nt) +
                          " --seq " + std::to_string(T) + " --reps " + std::to_string(reps);
  std::fflush(stdout);
  const int rc = std::system(cmd.c_str());
  if (rc != 0) std::printf("torch: script failed (exit %d)\n", rc);
  return 0;
}
