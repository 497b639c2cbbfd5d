// The hybrid's step on XLA's CPU plugin (issue #45 item 5): the delta rule chunked vs the token-by-token
// recurrence, and the MoE sparse (a capacity, moe.buffer_factor) vs dense (dropless), all four combinations
// in the same run on the same batch. The olmo3moe_tiny fixture's config (7 KDA layers + 1 attention layer,
// latent MoE 16 experts top-4) with random weights, one forward + backward per step, rows of T packed
// tokens. Prints one line per form (best of REPS after a warm-up, wall seconds) and the ratios to the
// recurrent + dense form, which was XLA's only form before.
//
//   bench_xla_hybrid [T=512] [B=2] [REPS=3] [BUFFER_FACTOR=2.5]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "model/config.h"
#include "model/decoder_xla.h"

using namespace olmosft;
using namespace olmosft::model;

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 512, B = argc > 2 ? std::atoll(argv[2]) : 2;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  const double bf = argc > 4 ? std::atof(argv[4]) : 2.5;
  const ModelConfig c =
      load_config(std::string(OLMOSFT_SOURCE_DIR) + "/tests/golden/model/olmo3moe_tiny/config.json");
  // rows of documents of 100 tokens (the last one shorter), every target trained
  std::vector<int32_t> tokens(size_t(B * T)), seg(size_t(B * T)), targets(size_t(B * T));
  std::vector<uint8_t> trained(size_t(B * T), 1);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[size_t(i)] = int32_t((i * 37 + 11) % (c.vocab_size - 1));
    seg[size_t(i)] = int32_t((i % T) / 100);
  }
  for (int64_t i = 0; i < B * T; ++i) targets[size_t(i)] = (i + 1) % T == 0 ? -100 : tokens[size_t(i + 1)];
  Batch b;
  b.B = B, b.T = T, b.tokens = tokens.data(), b.segments = seg.data(), b.targets = targets.data();
  b.trained = trained.data();
  std::printf("bench_xla_hybrid: olmo3moe_tiny config, B=%lld T=%lld, XLA's CPU plugin, best of %d\n",
              static_cast<long long>(B), static_cast<long long>(T), reps);
  double base = 0;
  for (const int64_t chunk : {int64_t(0), int64_t(64)})
    for (const double factor : {-1.0, bf}) {
      XlaOptions xo;
      xo.delta_chunk = chunk;
      auto m = make_xla_decoder(c, xo, 7);
      LossConfig lc;
      lc.vocab_tile = 128;
      lc.moe_buffer_factor = factor;
      int64_t dropped = 0;
      const auto [wall, cpu] = bench::best_of(reps, [&] {
        const LossParts p = m->forward_backward(b, lc, 1.0 / double(B * T), 1.0);
        dropped = 0;
        for (const MoeLayerStats& s : p.moe_layers) dropped += s.dropped_tokens;
      });
      if (base == 0) base = wall;
      std::printf("XLA-HYBRID delta=%s moe=%s step_s=%.4f cpu_s=%.4f vs_recurrent_dense=%.2fx dropped=%lld\n",
                  chunk == 0 ? "recurrent" : ("chunk" + std::to_string(chunk)).c_str(),
                  factor > 0 ? ("capacity" + std::to_string(factor).substr(0, 4)).c_str() : "dense", wall,
                  cpu, base / wall, static_cast<long long>(dropped));
    }
  return 0;
}
