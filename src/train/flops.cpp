#include "train/flops.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "model/layers.h"
#include "model/params.h"
#include "model/unit_block.h"
#include "train/batch.h"

namespace fs = std::filesystem;

namespace olmosft::train {

FlopCount& FlopCount::operator+=(const FlopCount& o) {
  dense += o.dense;
  attention += o.attention;
  kda += o.kda;
  lm_head += o.lm_head;
  kda_gemm += o.kda_gemm;
  conventional += o.conventional;
  tokens += o.tokens;
  trained += o.trained;
  documents += o.documents;
  return *this;
}

double attention_pairs(int64_t n, int64_t window) {
  const double N = static_cast<double>(n);
  if (window <= 0 || window >= n) return N * (N + 1) / 2;
  const double W = static_cast<double>(window);
  return W * (W + 1) / 2 + (N - W) * W;  // t < W sees t + 1 keys, every later query sees W
}

namespace {

// One chunk of n tokens, per (row, head), as kernels/kda_chunk.cpp does it. Terms that grow as n*K*V,
// n^2*K or n^2*V are counted; O(n*K), O(n*V), O(K*V) and O(n^2) elementwise terms and exponentials are not.
// Pairs (i, j) of the chunk in different sub-chunks of kda::kChunkSub tokens ("cross") are GEMMs, the
// others ("inner") loops.
//   forward:  Vn = U - W S, O = Qg S + Aqk Vn, S += Kl^T Vn (GEMMs 6nKV + 2n^2 V); one unit-lower solve on
//             [W | U] (n(n-1)(K+V)); P and Aqk: inner pairs j <= i 5K each (k_j e, two dot products), cross
//             pairs as the GEMM [K.Af; Q.Af] (K.Bf)^T (4K per pair).
//   backward: 7 GEMMs of n x K x V, dVn / dA / dM (6n^2 V + 2n^2 K), the transposed solve, the pairwise
//             gradients (inner: 13K per pair j < i, 4K per diagonal entry; cross: two GEMMs, 8K per pair).
//   recompute (backward): the chunk preparation (solve, pairwise) again for every chunk, and the state
//             update S <- e^Gam_last S + Kl^T Vn for each chunk followed by another of its document (the
//             forward's Vn is saved, kernels/kda.h).
KdaFlops kda_chunk_flops(int64_t n, double K, double V, bool has_next, bool recompute) {
  double cross = 0;
  for (int64_t a0 = kda::kChunkSub; a0 < n; a0 += kda::kChunkSub)
    cross += static_cast<double>(std::min(kda::kChunkSub, n - a0) * a0);
  const double N = static_cast<double>(n), inner = N * (N + 1) / 2 - cross,
               inner_strict = N * (N - 1) / 2 - cross;
  const double solves = N * (N - 1) * (K + V), prep_gemm = 4 * K * cross, prep_other = 5 * K * inner + solves;
  KdaFlops f;
  f.gemm = (6 * N * K * V + 2 * N * N * V + prep_gemm) +
           (12 * N * K * V + 6 * N * N * V + 2 * N * N * K + 8 * K * cross);
  f.other = prep_other + (solves + 13 * K * inner_strict + 4 * K * N);
  if (recompute) {
    f.gemm += prep_gemm + (has_next ? 2 * N * K * V : 0.0);
    f.other += prep_other;
  }
  return f;
}

// Per-token weight elements of the GEMMs that run once per token (dense bucket), and per routed
// (token, expert) assignment: the sum over the layer list of what each layer's units declare.
struct TokenWeights {
  double per_token = 0, per_routed = 0;
};

TokenWeights token_weights(const model::ModelConfig& c, const std::vector<model::LayerSpec>& layers) {
  TokenWeights w;
  for (const model::LayerSpec& s : layers) {
    w.per_token += model::unit::Block::gemm_weights_per_token(c, s);
    w.per_routed += model::unit::Block::gemm_weights_per_routed(c, s);
  }
  return w;
}

// Documents of a batch as (length) runs, and the token / trained counts.
struct Layout {
  std::vector<int64_t> docs;
  int64_t tokens = 0, trained = 0;
};

Layout batch_layout(const model::Batch& b) {
  OLMO_CHECK(b.B >= 0 && b.T >= 0, "training_flops: batch has B=", b.B, " T=", b.T, " (expected >= 0)");
  Layout L;
  for (int64_t r = 0; r < b.B; ++r) {
    int64_t run = 0;
    for (int64_t t = 0; t < b.T; ++t) {
      const int64_t i = r * b.T + t;
      const int32_t s = b.segments ? b.segments[i] : 0;
      const bool cont = t > 0 && (b.segments ? b.segments[i - 1] : 0) == s;
      if (run > 0 && (!cont || s < 0)) {
        L.docs.push_back(run);
        run = 0;
      }
      if (s < 0) continue;
      ++run;
      ++L.tokens;
      if (b.targets && (!b.trained || b.trained[i] != 0) && b.targets[i] != -100) ++L.trained;
    }
    if (run > 0) L.docs.push_back(run);
  }
  return L;
}

}  // namespace

KdaFlops kda_document_flops(int64_t n, int64_t K, int64_t V, int64_t chunk, bool recompute) {
  OLMO_CHECK(chunk > 0, "kda_document_flops: chunk must be > 0, got ", chunk);
  KdaFlops f;
  if (n <= 0) return f;
  const int64_t full = n / chunk, rest = n % chunk;
  const double k = static_cast<double>(K), v = static_cast<double>(V);
  if (full > 0) {
    // Every full chunk but the document's last has a successor.
    const KdaFlops mid = kda_chunk_flops(chunk, k, v, true, recompute);
    const KdaFlops last = kda_chunk_flops(chunk, k, v, rest > 0, recompute);
    f.gemm = static_cast<double>(full - 1) * mid.gemm + last.gemm;
    f.other = static_cast<double>(full - 1) * mid.other + last.other;
  }
  if (rest > 0) {
    const KdaFlops tail = kda_chunk_flops(rest, k, v, false, recompute);
    f.gemm += tail.gemm;
    f.other += tail.other;
  }
  return f;
}

FlopModel::FlopModel(const model::ModelConfig& c, const FlopOptions& o) : o_(o) {
  OLMO_CHECK(o.kda_chunk > 0, "training_flops: kda_chunk must be > 0, got ", o.kda_chunk);
  OLMO_CHECK(static_cast<int64_t>(c.layer_types.size()) == c.num_hidden_layers, "training_flops: config has ",
             c.layer_types.size(), " layer_types for ", c.num_hidden_layers, " layers");
  const std::vector<model::LayerSpec> layers = model::layer_specs(c);
  const TokenWeights w = token_weights(c, layers);
  per_token_ = w.per_token;
  per_routed_ = w.per_routed;
  top_k_ = model::has_ffn(layers, model::FfnKind::Moe) ? static_cast<double>(c.num_experts_per_tok) : 0.0;
  vd_ = static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size);
  // Attention per visible pair and query head: S = QK^T (2D) and O = PV (2Dv) forward; dV, dP, dK, dQ
  // (4D + 4Dv) backward; the backward recomputes S (+2D). Dv = D in both models.
  const double D = static_cast<double>(c.head_dim);
  per_pair_ = static_cast<double>(c.num_attention_heads) * (12 * D + (o.recompute ? 2 * D : 0.0));
  for (const model::LayerSpec& s : layers) {
    const bool attn = s.mixer == model::unit::kMixer<model::unit::AttentionUnit>;
    // each KDA / GDN head runs the same delta-rule kernels (GDN's decay broadcast over the key dimension)
    delta_heads_ += static_cast<double>(model::unit::Block::delta_rule_heads(c, s));
    full_layers_ += attn && s.window == 0;
    sliding_layers_ += attn && s.window != 0;
  }
  window_ = c.sliding_window;
  dk_ = c.linear_key_head_dim;
  dv_ = c.linear_value_head_dim;
  // 6N: N = active parameters less the input embedding (a lookup); the LM head matrix stays in N.
  n_params_ = static_cast<double>(model::count_params(c).active) - (c.tie_word_embeddings ? 0.0 : vd_);
}

double one_document_rows_flops(const model::ModelConfig& c, int64_t rows, int64_t T) {
  std::vector<int32_t> zeros(size_t(T), 0), pos(size_t(T), 0);
  std::vector<uint8_t> trained(size_t(T), 1);
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
  const model::Batch b = batch_view(1, T, zeros, zeros, pos, zeros, trained);
  return FlopModel(c).count(b).total() * double(rows);
}

FlopCount FlopModel::count(const model::Batch& b) const {
  const Layout lay = batch_layout(b);
  FlopCount f;
  f.tokens = lay.tokens;
  f.trained = lay.trained;
  f.documents = static_cast<int64_t>(lay.docs.size());
  const double tokens = static_cast<double>(lay.tokens);
  const double rows = o_.count_padding ? static_cast<double>(b.B * b.T) : tokens;
  // Per-token GEMMs: 2 forward (y = x W^T) + 4 backward (dx = dy W, dW += dy^T x). The routed experts'
  // forward is recomputed in the backward (kernels/moe.cpp), +2.
  f.dense = 6 * per_token_ * rows + (o_.recompute ? 8 : 6) * per_routed_ * top_k_ * tokens;
  // LM head: logits 2Vd forward; dh and dW 4Vd backward; the backward recomputes the logits (+2Vd).
  f.lm_head = (o_.recompute ? 8 : 6) * vd_ * static_cast<double>(lay.trained);
  for (int64_t n : lay.docs) {
    f.attention +=
        per_pair_ * (full_layers_ * attention_pairs(n, 0) + sliding_layers_ * attention_pairs(n, window_));
    if (delta_heads_ == 0) continue;
    const KdaFlops kf = kda_document_flops(n, dk_, dv_, o_.kda_chunk, o_.recompute);
    f.kda += delta_heads_ * (kf.gemm + kf.other);
    f.kda_gemm += delta_heads_ * kf.gemm;
  }
  f.conventional = 6 * n_params_ * tokens;
  return f;
}

FlopCount training_flops(const model::ModelConfig& c, const model::Batch& b, const FlopOptions& o) {
  return FlopModel(c, o).count(b);
}

double measure_peak_flops(int reps) {
  OLMO_CHECK(reps >= 1, "measure_peak_flops: reps must be >= 1, got ", reps);
  using Clock = std::chrono::steady_clock;
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = Clock::now();
    gemm_compute<float>(Precision::Compute, Trans::N, Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                        c.data(), n);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt > 0) best = std::max(best, 2.0 * n * n * n / dt);
  }
  return best;
}

namespace {

constexpr const char* kPeakFormat = "olmosft-peak-flops";

struct StoredPeak {
  double flops = 0;
  std::string origin;
};

StoredPeak read_peak_file(const std::string& path) {
  const std::string text = io::read_file(path);
  const std::string again = "; delete it to measure the peak again (the run's MFU denominator then changes)";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, " is not valid JSON (", e.what(), ")", again);
  }
  OLMO_CHECK(j.is_object() && j.value("format", std::string()) == kPeakFormat, path,
             " is not an olmosft peak-FLOP/s file (expected an object with \"format\": \"", kPeakFormat,
             "\")", again);
  OLMO_CHECK(j.contains("version") && j["version"].is_number_integer() && j["version"].get<int64_t>() == 1,
             path, ": \"version\" must be 1", again);
  StoredPeak p;
  OLMO_CHECK(j.contains("peak_flops") && j["peak_flops"].is_number(), path,
             ": \"peak_flops\" must be a number (FLOP/s per process)", again);
  p.flops = j["peak_flops"].get<double>();
  OLMO_CHECK(std::isfinite(p.flops) && p.flops > 0, path, ": \"peak_flops\" must be finite and > 0, got ",
             p.flops, again);
  OLMO_CHECK(j.contains("origin") && j["origin"].is_string(), path,
             ": \"origin\" must be \"measured\" or \"configured\"", again);
  p.origin = j["origin"].get<std::string>();
  OLMO_CHECK(p.origin == "measured" || p.origin == "configured", path,
             ": \"origin\" must be \"measured\" or \"configured\", got \"", p.origin, "\"", again);
  return p;
}

}  // namespace

double run_peak_flops(const std::string& run_dir, double configured_tflops, std::string* origin,
                      const std::function<double()>& measure) {
  OLMO_CHECK(std::isfinite(configured_tflops) && configured_tflops >= 0,
             "perf.peak_tflops must be finite and >= 0 (0 = measure), got ", configured_tflops);
  const std::string path = run_dir + "/peak_flops.json";
  const double configured = configured_tflops * 1e12;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    const StoredPeak p = read_peak_file(path);
    if (configured > 0) {
      OLMO_CHECK(p.origin == "configured" && std::fabs(p.flops - configured) <= 1e-9 * configured, path,
                 " holds the run's peak ", p.flops, " FLOP/s (", p.origin,
                 " at its first start) but perf.peak_tflops=", configured_tflops,
                 "; a resumed run keeps its MFU denominator: restore perf.peak_tflops, set it "
                 "to 0 to use the stored value, or delete the file to start over");
    }
    if (origin) *origin = p.origin + " at the run's first start, read from " + path;
    return p.flops;
  }
  OLMO_CHECK(!ec, "cannot check whether ", path, " exists: ", ec.message());
  double peak = configured;
  if (peak <= 0) {
    peak = measure ? measure() : measure_peak_flops();
    OLMO_CHECK(std::isfinite(peak) && peak > 0, "measuring the peak FLOP/s for ", path, " gave ", peak);
  }
  nlohmann::json j;
  j["format"] = kPeakFormat;
  j["version"] = 1;
  j["peak_flops"] = peak;
  j["origin"] = configured > 0 ? "configured" : "measured";
  j["per"] = "process";
  j["method"] = configured > 0 ? "perf.peak_tflops"
                               : "best of three 1024^3 GEMMs in the run's compute dtype, all threads";
  j["threads"] = num_threads();
  j["blas"] = blas_description();
  j["gemm"] = gemm_description();
  fs::create_directories(run_dir, ec);
  OLMO_CHECK(!ec, "cannot create the run directory ", run_dir, " for ", path, ": ", ec.message());
  io::write_file_atomic(path, j.dump(2) + "\n");
  if (origin)
    *origin = (configured > 0 ? std::string("configured") : std::string("measured")) + ", stored in " + path;
  return peak;
}

}  // namespace olmosft::train
