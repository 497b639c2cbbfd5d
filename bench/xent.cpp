// `make bench` → build/bench_xent: the fused LM-head softmax cross-entropy (forward + backward) at an
// SFT-like shape, tiled vs untiled, against the time of its GEMMs alone (the non-GEMM share is the exp /
// max / rescale work), with the exp of vexp.h (the path CPUID picks) and with glibc's scalar expf (vexp's
// `libm` path: the kernel's arithmetic before vexp), in the same run. Prints markdown rows; times are one run
// after a warm-up (the run is long), in wall and CPU seconds.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/rng.h"
#include "core/threads.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/vexp.h"

using namespace olmosft;
using bench::best_of;

int main() {
  const int64_t N = 512, d = 1024, V = 32000;
  std::vector<float> h(static_cast<size_t>(N * d)), W(static_cast<size_t>(V * d)),
      lse(static_cast<size_t>(N)), dh(static_cast<size_t>(N * d)), dW(static_cast<size_t>(V * d));
  Rng r{3, 4};
  for (size_t i = 0; i < h.size(); ++i) h[i] = r.normal(i);
  for (size_t i = 0; i < W.size(); ++i) W[i] = 0.02f * r.normal(i + h.size());
  std::vector<int32_t> tgt(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) tgt[size_t(i)] = int32_t((i * 7919) % V);
  const double gflop = 8.0 * double(N) * double(d) * double(V) / 1e9;  // fwd + recompute + dh + dW
  std::printf(
      "| CE fwd+bwd, %lld tok x %lld -> %lld (all trained) | exp | threads | wall s | CPU s | GFLOP/s (wall, "
      "8NdV) "
      "| "
      "GFLOP per CPU-s | GEMM-only CPU s / CE CPU s |\n|---|---|---|---|---|---|---|---|\n",
      (long long)N, (long long)d, (long long)V);
  const int saved = num_threads();
  const VexpPath best = vexp_path();
  std::vector<std::string> ratios;
  for (int t : {1, 2}) {
    set_threads(t);
    std::vector<float> logits(static_cast<size_t>(N * V));
    auto gemms = best_of(1, [&] {  // the four GEMMs alone, at the same total size
      gemm<float>(Trans::N, Trans::T, N, V, d, 1.f, h.data(), d, W.data(), d, 0.f, logits.data(), V);
      gemm<float>(Trans::N, Trans::T, N, V, d, 1.f, h.data(), d, W.data(), d, 0.f, logits.data(), V);
      gemm<float>(Trans::N, Trans::N, N, d, V, 1.f, logits.data(), V, W.data(), d, 0.f, dh.data(), d);
      gemm<float>(Trans::T, Trans::N, V, d, N, 1.f, logits.data(), V, h.data(), d, 1.f, dW.data(), d);
    });
    for (auto [chunk, block, name] : {std::tuple{int64_t(0), int64_t(0), "untiled"},
                                      std::tuple{int64_t(4096), int64_t(1024), "tiled 4096 x 1024"}}) {
      XentConfig cfg;
      cfg.valid_vocab = V;
      cfg.z_loss = 1e-5;
      cfg.vocab_chunk = chunk;
      cfg.row_block = block;
      double cpu_libm = 0;
      for (VexpPath path : {VexpPath::kLibm, best}) {
        vexp_set_path(path);
        auto tm = best_of(1, [&] {
          xent_forward<float>(h.data(), W.data(), tgt.data(), nullptr, N, d, V, cfg, lse.data());
          xent_backward<float>(h.data(), W.data(), tgt.data(), nullptr, lse.data(), N, d, V, cfg, 1.0 / N,
                               dh.data(), dW.data());
        });
        std::printf("| %s | %s | %d | %.3f | %.3f | %.1f | %.1f | %.2f |\n", name, vexp_path_name(path), t,
                    tm.first, tm.second, gflop / tm.first, gflop / tm.second, gemms.second / tm.second);
        if (path == VexpPath::kLibm)
          cpu_libm = tm.second;
        else
          ratios.push_back(std::string(name) + ", " + std::to_string(t) + " thread(s): libm / " +
                           vexp_path_name(path) + " CPU time = " + std::to_string(cpu_libm / tm.second));
      }
    }
  }
  set_threads(saved);
  vexp_set_path(best);
  std::printf("\n");
  for (const auto& r : ratios) std::printf("- CE speed-up from vexp, same run: %s\n", r.c_str());
  return 0;
}
