// MFU accounting (train/flops.h): attention pairs per document against a per-position brute force on random
// packed layouts, closed forms for one-document rows, padding, the KDA chunk count against an independent
// enumeration, and the dense + LM-head (+ KDA GEMM) terms against the GEMMs a real forward_backward of a
// tiny Olmo 3 and a tiny hybrid actually runs (kernels/gemm.h's test-only counter). Also the run's peak:
// measured once, stored, read back on resume, and the errors for bad files.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "../scratch_dir.h"
#include "core/error.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/params.h"
#include "train/batch.h"
#include "train/flops.h"

namespace fs = std::filesystem;
using namespace olmosft;
using namespace olmosft::train;
using model::LayerType;

namespace {

model::ModelConfig preset(const std::string& name) {
  return model::parse_config(model::preset_config_json(name), name);
}

// A packed batch: rows of documents with optional padding runs between and after them.
struct PackedBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, segments, positions, targets;
  std::vector<uint8_t> trained;
  model::Batch view() const {
    return olmosft::train::batch_view(B, T, tokens, segments, positions, targets, trained);
  }
};

PackedBatch random_batch(std::mt19937& rng, int64_t B, int64_t T, int64_t max_doc, int64_t vocab,
                         double pad_prob = 0.25) {
  PackedBatch p;
  p.B = B;
  p.T = T;
  const size_t N = static_cast<size_t>(B * T);
  p.tokens.assign(N, 0);
  p.segments.assign(N, -1);
  p.positions.assign(N, 0);
  p.targets.assign(N, -100);
  p.trained.assign(N, 0);
  std::uniform_int_distribution<int64_t> len(1, max_doc), pad(1, 5), tok(0, vocab - 1);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t r = 0; r < B; ++r) {
    int64_t t = 0;
    int32_t doc = 0;
    while (t < T) {
      if (u(rng) < pad_prob) {
        t += pad(rng);  // a padding run
        continue;
      }
      const int64_t n = std::min(len(rng), T - t);
      for (int64_t i = 0; i < n; ++i, ++t) {
        const size_t x = static_cast<size_t>(r * T + t);
        p.segments[x] = doc;
        p.positions[x] = static_cast<int32_t>(i);
        p.tokens[x] = static_cast<int32_t>(tok(rng));
        if (i + 1 < n && u(rng) < 0.6) {  // trained targets inside documents only
          p.trained[x] = 1;
          p.targets[x] = static_cast<int32_t>(tok(rng));
        }
      }
      ++doc;
    }
  }
  return p;
}

// Per-position brute force of the visible (query, key) pairs: query i sees key j iff both are in the same
// non-padding document run, j <= i and (window <= 0 or i - j < window).
double brute_pairs(const model::Batch& b, int64_t window) {
  double n = 0;
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t i = 0; i < b.T; ++i) {
      const int32_t s = b.segments[r * b.T + i];
      if (s < 0) continue;
      for (int64_t j = i; j >= 0 && b.segments[r * b.T + j] == s; --j)
        if (window <= 0 || i - j < window) n += 1;
    }
  return n;
}

TEST(TrainFlops, AttentionPairsMatchPerPositionBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    model::ModelConfig c = preset("olmo3-tiny");
    c.sliding_window = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    const PackedBatch p = random_batch(rng, 3, 97, trial % 2 ? 60 : 12, c.vocab_size);
    const model::Batch b = p.view();
    double expect = 0;
    for (LayerType t : c.layer_types)
      expect += brute_pairs(b, t == LayerType::SlidingAttention ? c.sliding_window : 0);
    expect *= 12.0 * static_cast<double>(c.num_attention_heads * c.head_dim);
    const FlopCount f = training_flops(c, b);
    EXPECT_DOUBLE_EQ(f.attention, expect) << "trial " << trial << " window " << c.sliding_window;
    // The backward's recomputed scores add 2D per pair and head: 14/12 of the model count.
    EXPECT_DOUBLE_EQ(training_flops(c, b, {64, true, false}).attention, expect * 14.0 / 12.0);
  }
}

TEST(TrainFlops, SingleDocumentRowMatchesClosedForms) {
  const model::ModelConfig c = preset("olmo3-tiny");
  const int64_t T = 200, W = c.sliding_window, B = 2;
  ASSERT_LT(W, T);
  PackedBatch p;
  p.B = B;
  p.T = T;
  p.tokens.assign(B * T, 1);
  p.segments.assign(B * T, 5);
  p.positions.assign(B * T, 0);
  p.targets.assign(B * T, 3);
  p.trained.assign(B * T, 1);
  const FlopCount f = training_flops(c, p.view());
  const double HD = static_cast<double>(c.num_attention_heads * c.head_dim), t = T;
  double expect = 0;
  for (LayerType lt : c.layer_types)
    expect += lt == LayerType::FullAttention ? t * (t + 1) / 2 : W * (W + 1) / 2.0 + (t - W) * W;
  EXPECT_DOUBLE_EQ(f.attention, 12 * HD * expect * B);
  // Dense: 6 x (every 2-D weight but the embedding and the LM head) per token; LM head 6Vd per target.
  double body = 0, norms = 0;
  for (const auto& s : model::param_registry(c)) {
    if (s.name == "model.embed_tokens.weight" || s.name == "lm_head.weight") continue;
    (s.shape.size() == 2 ? body : norms) += static_cast<double>(shape_numel(s.shape));
  }
  const double Vd = static_cast<double>(c.vocab_size * c.hidden_size);
  EXPECT_DOUBLE_EQ(f.dense, 6 * body * B * T);
  EXPECT_DOUBLE_EQ(f.lm_head, 6 * Vd * B * T);
  EXPECT_EQ(f.tokens, B * T);
  EXPECT_EQ(f.trained, B * T);
  EXPECT_EQ(f.documents, B);
  EXPECT_DOUBLE_EQ(f.kda, 0.0);
  // 6N counts the norms' parameters too, and the LM head on every token.
  EXPECT_DOUBLE_EQ(f.conventional, 6 * (body + norms + Vd) * B * T);
  EXPECT_DOUBLE_EQ(f.total(), f.dense + f.attention + f.lm_head);
  // Without segments, each row is one document: the same counts.
  model::Batch nb = p.view();
  nb.segments = nullptr;
  EXPECT_DOUBLE_EQ(training_flops(c, nb).total(), f.total());
  EXPECT_DOUBLE_EQ(attention_pairs(T, 0), t * (t + 1) / 2);
  EXPECT_DOUBLE_EQ(attention_pairs(T, T + 5), t * (t + 1) / 2);
  EXPECT_DOUBLE_EQ(attention_pairs(0, 3), 0.0);
}

TEST(TrainFlops, PaddingCountsNothing) {
  for (const char* name : {"olmo3-tiny", "olmo3moe-tiny"}) {
    const model::ModelConfig c = preset(name);
    std::mt19937 rng(3);
    PackedBatch p = random_batch(rng, 2, 80, 30, c.vocab_size, 0.0);
    const FlopCount f0 = training_flops(c, p.view());
    // The same documents with padding appended to each row: no model FLOP changes.
    PackedBatch q;
    q.B = p.B;
    q.T = p.T + 23;
    for (int64_t r = 0; r < p.B; ++r) {
      auto row = [&](auto& dst, const auto& src, auto fill) {
        dst.insert(dst.end(), src.begin() + r * p.T, src.begin() + (r + 1) * p.T);
        dst.insert(dst.end(), 23, fill);
      };
      row(q.tokens, p.tokens, 0);
      row(q.segments, p.segments, -1);
      row(q.positions, p.positions, 0);
      row(q.targets, p.targets, 7);  // a target under padding is not a trained target either
      row(q.trained, p.trained, uint8_t{1});
    }
    const FlopCount f1 = training_flops(c, q.view());
    EXPECT_DOUBLE_EQ(f1.total(), f0.total()) << name;
    EXPECT_DOUBLE_EQ(f1.conventional, f0.conventional) << name;
    EXPECT_EQ(f1.trained, f0.trained) << name;
    // count_padding: the per-token GEMMs run on every row position; only `dense` grows, and by the padding
    // tokens' share of the per-token work.
    const FlopCount fp = training_flops(c, q.view(), {64, false, true});
    EXPECT_GT(fp.dense, f1.dense) << name;
    EXPECT_DOUBLE_EQ(fp.attention + fp.kda + fp.lm_head, f1.attention + f1.kda + f1.lm_head) << name;
    // An all-padding batch: zero.
    std::fill(q.segments.begin(), q.segments.end(), -1);
    const FlopCount fz = training_flops(c, q.view());
    EXPECT_EQ(fz.total(), 0.0) << name;
    EXPECT_EQ(fz.conventional, 0.0) << name;
    EXPECT_EQ(fz.documents, 0) << name;
  }
}

TEST(TrainFlops, MicroBatchesAddUp) {
  // A step's FLOPs are the sum over its micro-batches: two rows counted together or one at a time agree.
  const model::ModelConfig c = preset("olmo3moe-tiny");
  std::mt19937 rng(21);
  const PackedBatch p = random_batch(rng, 2, 90, 50, c.vocab_size);
  FlopCount sum;
  const FlopModel per_run(c);  // built once, as the trainer would
  for (int64_t r = 0; r < 2; ++r) {
    model::Batch one = p.view();
    one.B = 1;
    const size_t off = static_cast<size_t>(r * p.T);
    one.tokens += off, one.segments += off, one.positions += off, one.targets += off, one.trained += off;
    sum += per_run.count(one);
  }
  const FlopCount all = training_flops(c, p.view());
  EXPECT_DOUBLE_EQ(sum.total(), all.total());
  EXPECT_DOUBLE_EQ(sum.kda_gemm, all.kda_gemm);
  EXPECT_DOUBLE_EQ(sum.conventional, all.conventional);
  EXPECT_EQ(sum.tokens, all.tokens);
  EXPECT_EQ(sum.trained, all.trained);
  EXPECT_EQ(sum.documents, all.documents);
  EXPECT_GT(all.kda, 0.0);
  EXPECT_GT(all.attention, 0.0);
}

// An independent count of the chunked delta rule for one (row, head): the chunks are enumerated token by
// token as kernels/kda_chunk.cpp cuts them, each GEMM the kernel calls is listed with its (M, N, K), and
// the triangular solves and pairwise loops are counted by looping over their entries.
struct KdaBrute {
  double gemm = 0, other = 0;
};
KdaBrute kda_brute(const std::vector<int32_t>& seg, int64_t K, int64_t V, int64_t C, bool recompute) {
  struct Ch {
    int64_t n;
    bool reset;
  };
  std::vector<Ch> chunks;
  const int64_t L = static_cast<int64_t>(seg.size());
  for (int64_t t = 0; t < L;) {
    if (seg[t] < 0) {
      ++t;
      continue;
    }
    const bool reset = t == 0 || seg[t - 1] != seg[t];
    int64_t e = t + 1;
    while (e < L && e - t < C && seg[e] == seg[t]) ++e;
    chunks.push_back({e - t, reset});
    t = e;
  }
  KdaBrute k;
  auto g = [&](double M, double N, double KK) { k.gemm += 2 * M * N * KK; };
  auto solve = [&](int64_t n, int64_t cols) {
    for (int64_t i = 0; i < n; ++i) k.other += 2.0 * static_cast<double>(i * cols);
  };
  const int64_t S = olmosft::kda::kChunkSub;
  // P and Aqk: pairs in one sub-chunk by loops, the blocks of each sub-chunk's rows against the earlier
  // tokens by one GEMM [K.Af; Q.Af] (K.Bf)^T; then the solve on [W | U].
  auto prepare = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j)
        if (i / S == j / S) k.other += 5.0 * K;
    for (int64_t a0 = S; a0 < n; a0 += S) g(2.0 * std::min(S, n - a0), a0, K);
    solve(n, K + V);
  };
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const double n = chunks[ci].n;
    const int64_t ni = chunks[ci].n;
    // forward: [Qg; W] S, Aqk Vn, Kl^T Vn
    prepare(ni);
    g(2 * n, V, K), g(n, V, n), g(K, V, n);
    // backward pass 1: the state entering chunk ci + 1 from chunk ci and the forward's Vn
    const bool has_next = ci + 1 < chunks.size() && !chunks[ci + 1].reset;
    if (recompute && has_next) g(K, V, n);
    // backward pass 2
    if (recompute) prepare(ni);
    g(n, V, n), g(n, V, K), g(n, n, V), g(2 * n, K, V), g(K, V, 2 * n), g(n, K, V);
    solve(ni, K + V);
    g(n, n, K + V);
    for (int64_t a0 = S; a0 < ni; a0 += S) {
      const double m = static_cast<double>(std::min(S, ni - a0));
      g(2 * m, K, a0), g(a0, K, 2 * m);
    }
    for (int64_t i = 0; i < ni; ++i) {
      for (int64_t j = 0; j < i; ++j)
        if (i / S == j / S) k.other += 13.0 * K;
      k.other += 4.0 * K;
    }
  }
  return k;
}

TEST(TrainFlops, KdaMatchesIndependentChunkEnumeration) {
  std::mt19937 rng(11);
  model::ModelConfig c = preset("olmo3moe-tiny");
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t chunk = std::vector<int64_t>{1, 3, 16, 64}[static_cast<size_t>(trial % 4)];
    const bool recompute = trial % 3 == 0;
    const PackedBatch p = random_batch(rng, 2, 150, trial % 2 ? 100 : 20, c.vocab_size);
    double gemm = 0, other = 0;
    for (int64_t r = 0; r < p.B; ++r) {
      std::vector<int32_t> seg(p.segments.begin() + r * p.T, p.segments.begin() + (r + 1) * p.T);
      const KdaBrute k = kda_brute(seg, c.linear_key_head_dim, c.linear_value_head_dim, chunk, recompute);
      gemm += k.gemm;
      other += k.other;
    }
    int64_t kda_layers = 0;
    for (LayerType t : c.layer_types) kda_layers += t == LayerType::LinearAttention;
    const double scale = static_cast<double>(kda_layers * c.linear_num_key_heads);
    const FlopCount f = training_flops(c, p.view(), {chunk, recompute, false});
    EXPECT_DOUBLE_EQ(f.kda_gemm, scale * gemm) << "trial " << trial;
    EXPECT_DOUBLE_EQ(f.kda, scale * (gemm + other)) << "trial " << trial;
  }
  EXPECT_THROW(kda_document_flops(10, 4, 4, 0, false), Error);
}

// Runs forward_backward under the GEMM counter and compares with training_flops' GEMM terms.
void expect_gemm_count(model::CausalLM& m, const PackedBatch& p, int64_t kda_chunk, const std::string& what) {
  uint64_t counted = 0;
  {
    GemmFlopCounter counter;
    m.forward_backward(p.view(), model::LossConfig{}, 1e-3, 1.0);
    counted = counter.flops();
  }
  // recompute + count_padding = the work as the kernels do it. The dense GEMMs run on every row position;
  // routed experts on the routed (non-padding) tokens, all of them (dropless); the LM head on the trained
  // targets, its logits recomputed in the backward; KDA's chunk GEMMs per document. Attention's tile
  // products and KDA's solves call cblas directly and are not in the counter. Every term is an integer far
  // below 2^53, so the two sums agree up to double rounding of the sum (a few ulps), nothing else.
  const FlopCount f = training_flops(m.config(), p.view(), {kda_chunk, true, true});
  ASSERT_GT(counted, 0u);
  EXPECT_DOUBLE_EQ(static_cast<double>(counted), f.dense + f.lm_head + f.kda_gemm) << what;
  // And the counter is really off afterwards.
  std::vector<float> a(16, 1.0f), out(16);
  gemm<float>(Trans::N, Trans::N, 4, 4, 4, 1.0f, a.data(), 4, a.data(), 4, 0.0f, out.data(), 4);
  GemmFlopCounter again;
  EXPECT_EQ(again.flops(), 0u);
}

TEST(TrainFlops, GemmCounterMatchesOlmo3ForwardBackward) {
  set_threads(2);
  const model::ModelConfig c = preset("olmo3-tiny");
  auto m = model::make_model(c, 1);
  std::mt19937 rng(5);
  const PackedBatch p = random_batch(rng, 2, 72, 30, c.vocab_size);
  expect_gemm_count(*m, p, 64, "olmo3-tiny");
}

TEST(TrainFlops, GemmCounterMatchesHybridForwardBackward) {
  set_threads(2);
  const model::ModelConfig c = preset("olmo3moe-tiny");
  model::DecoderOptions opts;
  opts.kda_chunk = 16;  // several chunks per document
  auto m = model::make_decoder(c, 1, opts);
  std::mt19937 rng(9);
  const PackedBatch p = random_batch(rng, 2, 64, 40, c.vocab_size);
  expect_gemm_count(*m, p, opts.kda_chunk, "olmo3moe-tiny");
}

// Olmo Hybrid: the GDN layers' projections (q/k/v, a, b, g, o) and their delta rule (KDA's chunk GEMMs, one
// decay per head) as counted in the kernels.
TEST(TrainFlops, GemmCounterMatchesOlmoHybridForwardBackward) {
  set_threads(2);
  const model::ModelConfig c = preset("olmo-hybrid-tiny");
  model::DecoderOptions opts;
  opts.kda_chunk = 16;
  auto m = model::make_decoder(c, 1, opts);
  std::mt19937 rng(13);
  const PackedBatch p = random_batch(rng, 2, 64, 40, c.vocab_size);
  expect_gemm_count(*m, p, opts.kda_chunk, "olmo-hybrid-tiny");
  EXPECT_GT(training_flops(c, p.view(), {16, true, false}).kda_gemm, 0.0);
}

TEST(TrainFlops, GemmCounterCountsAndStaysExclusive) {
  std::vector<double> a(6 * 5, 0.5), b(5 * 7, 0.25), out(6 * 7);
  uint64_t n = 0;
  {
    GemmFlopCounter counter;
    EXPECT_THROW(GemmFlopCounter second, Error);
    gemm<double>(Trans::N, Trans::N, 6, 7, 5, 1.0, a.data(), 5, b.data(), 7, 0.0, out.data(), 7);
    gemm_strided_batched<double>(Trans::N, Trans::N, 3, 7, 5, 1.0, a.data(), 5, 15, b.data(), 7, 0, 0.0,
                                 out.data(), 7, 21, 2);
    n = counter.flops();
  }
  EXPECT_EQ(n, 2u * 6 * 7 * 5 + 2u * (2u * 3 * 7 * 5));
}

// --- the run's peak ---------------------------------------------------------------------------------------

std::string temp_run(const std::string& name) {
  static const testutil::ScratchDir scratch("olmosft_flops");  // removed at exit
  const fs::path d = fs::path(scratch.path()) / (name + "_" + io::random_suffix());
  fs::create_directories(d);
  return d.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainFlops, PeakIsMeasuredOncePerRun) {
  const std::string dir = temp_run("measured");
  int calls = 0;
  auto measure = [&] { return ++calls, 1.5e11; };
  std::string origin;
  EXPECT_EQ(run_peak_flops(dir, 0, &origin, measure), 1.5e11);
  EXPECT_EQ(calls, 1);
  EXPECT_NE(origin.find("measured"), std::string::npos) << origin;
  const auto j = nlohmann::json::parse(io::read_file(dir + "/peak_flops.json"));
  EXPECT_EQ(j["peak_flops"].get<double>(), 1.5e11);
  EXPECT_EQ(j["origin"], "measured");
  // A resume reads it back: no second measurement, the same denominator.
  auto other = [&] { return ++calls, 9e11; };
  EXPECT_EQ(run_peak_flops(dir, 0, &origin, other), 1.5e11);
  EXPECT_EQ(calls, 1);
  EXPECT_NE(origin.find("first start"), std::string::npos) << origin;
  // A configured value on resume that contradicts the stored peak is an error naming the file.
  const std::string e = error_of([&] { run_peak_flops(dir, 2.0, nullptr, other); });
  EXPECT_NE(e.find(dir + "/peak_flops.json"), std::string::npos) << e;
  EXPECT_NE(e.find("perf.peak_tflops"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(TrainFlops, ConfiguredPeakIsStoredAndNotMeasured) {
  const std::string dir = temp_run("configured") + "/not/yet/there";
  auto never = []() -> double { throw std::logic_error("measured although configured"); };
  EXPECT_EQ(run_peak_flops(dir, 2.5, nullptr, never), 2.5e12);
  EXPECT_EQ(run_peak_flops(dir, 2.5, nullptr, never), 2.5e12);  // resume, same value
  EXPECT_EQ(run_peak_flops(dir, 0, nullptr, never), 2.5e12);    // resume, unset: the stored value
  EXPECT_THROW(run_peak_flops(dir, 3.0, nullptr, never), Error);
  EXPECT_THROW(run_peak_flops(dir, -1.0, nullptr, never), Error);
  EXPECT_THROW(run_peak_flops(temp_run("nan"), NAN, nullptr, never), Error);
  // A run directory that cannot be created (a file is in the way) is an error naming it.
  const std::string blocked = temp_run("blocked");
  std::ofstream(blocked + "/file") << "x";
  const std::string e = error_of([&] { run_peak_flops(blocked + "/file/run", 1.0, nullptr, never); });
  EXPECT_NE(e.find(blocked + "/file/run"), std::string::npos) << e;
  fs::remove_all(blocked);
  // The real measurement (the default) gives a positive rate.
  const std::string real = temp_run("real");
  EXPECT_GT(run_peak_flops(real, 0), 0.0);
  EXPECT_TRUE(fs::exists(real + "/peak_flops.json"));
  EXPECT_THROW(measure_peak_flops(0), Error);
  fs::remove_all(real);
}

TEST(TrainFlops, BadPeakFilesAreClearErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "not an olmosft peak-FLOP/s file"},
      {R"({"format": "something-else", "version": 1, "peak_flops": 1e9, "origin": "measured"})",
       "not an olmosft peak-FLOP/s file"},
      {R"({"format": "olmosft-peak-flops", "version": 2, "peak_flops": 1e9, "origin": "measured"})",
       "version"},
      {R"({"format": "olmosft-peak-flops", "version": 1, "peak_flops": "fast", "origin": "measured"})",
       "peak_flops"},
      {R"({"format": "olmosft-peak-flops", "version": 1, "peak_flops": -5, "origin": "measured"})",
       "peak_flops"},
      {R"({"format": "olmosft-peak-flops", "version": 1, "peak_flops": 1e9, "origin": "guessed"})", "origin"},
  };
  for (const auto& [text, want] : cases) {
    const std::string dir = temp_run("bad");
    std::ofstream(dir + "/peak_flops.json") << text;
    const std::string e = error_of([&] { run_peak_flops(dir, 0, nullptr, [] { return 1.0; }); });
    EXPECT_NE(e.find(dir + "/peak_flops.json"), std::string::npos) << text << " -> " << e;
    EXPECT_NE(e.find(want), std::string::npos) << text << " -> " << e;
    fs::remove_all(dir);
  }
}

TEST(TrainFlops, InvalidInputsAreErrors) {
  model::ModelConfig c = preset("olmo3-tiny");
  PackedBatch p;
  p.B = 1;
  p.T = 4;
  p.tokens.assign(4, 0);
  p.segments.assign(4, 0);
  p.positions.assign(4, 0);
  p.targets.assign(4, -100);
  p.trained.assign(4, 0);
  EXPECT_THROW(training_flops(c, p.view(), {0, false, false}), Error);
  c.layer_types.pop_back();
  EXPECT_THROW(training_flops(c, p.view()), Error);
}

}  // namespace
