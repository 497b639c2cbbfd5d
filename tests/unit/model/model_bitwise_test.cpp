// Bit-identity guards for the model, each comparing runs made in the same test on the same machine (never
// hashes recorded elsewhere: bits depend on the CPU's BLAS kernels and libm; docs/numerics.md). Every number
// the two model families produce (seeded initial parameters, LossParts, accumulated gradients, logits,
// log-probs; the hybrid also in its float64 instantiation) on fixed packed batches is hashed per tensor
// (FNV-1a 64), and:
//   - recomputation (model.remat full / attn) gives the bits of remat none, on both fp32 GEMM libraries;
//   - with bf16 saved activations (model.saved_dtype=bf16, remat none or attn) a run repeats bit for bit;
//   - a run repeats bit for bit.
// A refactor (a change that must change no number) is checked the same way across two builds on one machine:
// scripts/bitwise-compare.sh BASE_REF runs this test with OLMOSFT_BITWISE_DUMP=FILE in both and compares.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kernels/gemm.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/params.h"
#include "train/batch.h"

using namespace olmosft;
using namespace olmosft::model;

namespace {

struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= c[i];
      h *= 1099511628211ull;
    }
  }
  template <typename T>
  void values(const T* p, int64_t n) {
    bytes(p, static_cast<size_t>(n) * sizeof(T));
  }
};

template <typename T>
uint64_t hash_of(const T* p, int64_t n) {
  Hasher hs;
  hs.values(p, n);
  return hs.h;
}

// Records name -> hash in order.
struct Record {
  std::vector<std::pair<std::string, uint64_t>> rows;
  void add(const std::string& key, uint64_t h) { rows.emplace_back(key, h); }
  void parts(const std::string& key, const LossParts& lp) {
    Hasher hs;
    for (double v : {lp.sum[model::kLossCe], lp.sum[model::kLossLmZ], lp.sum[model::kLossMoeLb],
                     lp.sum[model::kLossRouterZ]})
      hs.values(&v, 1);
    hs.values(&lp.tokens, 1);
    for (const auto& m : lp.moe_layers) {
      hs.values(&m.layer, 1);
      for (double v : {m.lb_loss, m.router_z, m.required_buffer_factor}) hs.values(&v, 1);
      hs.values(&m.dropped_tokens, 1);
    }
    add(key, hs.h);
  }
};

// A packed batch: rows of documents with the given lengths (the rest of each row is padding); the first
// two tokens of every document and its last token are untrained.
struct PackedBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, segments, positions, targets;
  std::vector<uint8_t> trained;
  PackedBatch(const std::vector<std::vector<int64_t>>& docs, int64_t T_, int64_t vocab, uint32_t seed) {
    B = static_cast<int64_t>(docs.size());
    T = T_;
    const size_t N = static_cast<size_t>(B * T);
    tokens.assign(N, 0);
    segments.assign(N, -1);
    positions.assign(N, 0);
    targets.assign(N, -100);
    trained.assign(N, 0);
    uint32_t s = seed;
    for (int64_t r = 0; r < B; ++r) {
      int64_t t = 0;
      int32_t id = 0;
      for (int64_t len : docs[static_cast<size_t>(r)]) {
        for (int64_t p = 0; p < len; ++p, ++t) {
          const size_t i = static_cast<size_t>(r * T + t);
          s = s * 1664525u + 1013904223u;
          tokens[i] = static_cast<int32_t>(2 + (s >> 8) % static_cast<uint32_t>(vocab - 2));
          segments[i] = id;
          positions[i] = static_cast<int32_t>(p);
        }
        ++id;
      }
      for (int64_t t2 = 0; t2 < T; ++t2) {
        const size_t i = static_cast<size_t>(r * T + t2);
        if (segments[i] < 0) continue;
        const bool last = t2 + 1 == T || segments[i + 1] != segments[i];
        if (last) continue;
        targets[i] = tokens[i + 1];
        trained[i] = positions[i] >= 2 ? 1 : 0;
      }
    }
  }
  Batch batch() const {
    return olmosft::train::batch_view(B, T, tokens, segments, positions, targets, trained);
  }
};

const PackedBatch& batch_a(int64_t vocab) {
  static const PackedBatch b({{30, 25, 17}, {40, 20}}, 72, vocab, 12345u);
  return b;
}
const PackedBatch& batch_b(int64_t vocab) {  // smaller B*T: the workspace is reused
  static const PackedBatch b({{11, 29}, {7, 9, 13}}, 40, vocab, 777u);
  return b;
}

LossConfig loss_config() {
  LossConfig lc;
  lc.weight[model::kLossLmZ] = 1e-4;
  lc.weight[model::kLossMoeLb] = 0.01;
  lc.weight[model::kLossRouterZ] = 0.001;
  lc.vocab_tile = 192;  // 512 = 192 + 192 + 128: the tiled cross-entropy
  return lc;
}

void record_params(Record& rec, const std::string& prefix, CausalLM& m, bool grads) {
  for (auto& p : m.params()) {
    const Tensor& t = grads ? p.grad : p.value;
    rec.add(prefix + p.name, hash_of(t.data<float>(), t.numel()));
  }
}

// Initial values, two accumulating forward_backward calls (the second on a smaller batch, with a
// capacity limit for the hybrid), then forward with logits and log-probs.
void run_family(Record& rec, const std::string& fam, CausalLM& m) {
  const int64_t V = m.config().vocab_size;
  record_params(rec, fam + ".init.", m, false);
  LossConfig lc = loss_config();
  const PackedBatch& a = batch_a(V);
  const PackedBatch& b = batch_b(V);
  rec.parts(fam + ".fb1", m.forward_backward(a.batch(), lc, 1.0 / 97.0, 0.5));
  LossConfig lc2 = lc;
  lc2.moe_buffer_factor = 1.0;
  rec.parts(fam + ".fb2", m.forward_backward(b.batch(), lc2, 1.0 / 53.0, 0.25));
  record_params(rec, fam + ".grad.", m, true);
  std::vector<float> logits(static_cast<size_t>(a.B * a.T * V)), logprobs(static_cast<size_t>(a.B * a.T));
  rec.parts(fam + ".fwd", m.forward(a.batch(), lc, logits.data(), logprobs.data()));
  rec.add(fam + ".fwd.logits", hash_of(logits.data(), static_cast<int64_t>(logits.size())));
  rec.add(fam + ".fwd.logprobs", hash_of(logprobs.data(), static_cast<int64_t>(logprobs.size())));
}

// The hybrid's float64 instantiation on the same (float-initialised) weights, chunk 16.
void run_hybrid_double(Record& rec, CausalLM& m, const MemoryPolicy& policy) {
  const ModelConfig& c = m.config();
  std::vector<std::vector<double>> w, g;
  for (auto& p : m.params()) {
    const float* v = p.value.data<float>();
    w.emplace_back(v, v + p.value.numel());
    g.emplace_back(static_cast<size_t>(p.value.numel()), 0.0);
  }
  std::vector<const double*> wp;
  std::vector<double*> gp;
  for (auto& x : w) wp.push_back(x.data());
  for (auto& x : g) gp.push_back(x.data());
  DecoderOptions opts;
  opts.kda_chunk = 16;
  opts.memory = policy;
  const PackedBatch& a = batch_a(c.vocab_size);
  const LossConfig lc = loss_config();
  rec.parts("hybrid64.fb",
            decoder_run<double>(c, opts, wp, &gp, a.batch(), lc, 1.0 / 97.0, 0.5, nullptr, nullptr));
  for (size_t i = 0; i < g.size(); ++i)
    rec.add("hybrid64.grad." + m.params()[i].name, hash_of(g[i].data(), static_cast<int64_t>(g[i].size())));
  std::vector<float> logits(static_cast<size_t>(a.B * a.T * c.vocab_size)),
      logprobs(static_cast<size_t>(a.B * a.T));
  opts.kda_recurrent = true;
  rec.parts("hybrid64.fwd_recurrent", decoder_run<double>(c, opts, wp, nullptr, a.batch(), lc, 1.0, 1.0,
                                                          logits.data(), logprobs.data()));
  rec.add("hybrid64.fwd_recurrent.logits", hash_of(logits.data(), static_cast<int64_t>(logits.size())));
  rec.add("hybrid64.fwd_recurrent.logprobs", hash_of(logprobs.data(), static_cast<int64_t>(logprobs.size())));
}

// Every hash under a memory policy and a GEMM library, on one thread. (The thread count is not a guard: the
// GEMM libraries' threaded kernels split their sums by thread on some CPUs, e.g. OpenBLAS's Haswell kernels
// and oneDNN's AVX2 ones; docs/numerics.md.)
Record compute(const MemoryPolicy& policy = {}, GemmLib lib = GemmLib::OpenBLAS) {
  set_threads(1);
  const ScopedCpuGemm pin({lib, ComputeDtype::F32});
  Record rec;
  {
    const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3_tiny/config.json");
    auto m = make_model(c, 20261203);
    EXPECT_TRUE(m->set_memory_policy(policy));
    run_family(rec, "olmo3", *m);
  }
  {
    const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3moe_tiny/config.json");
    auto m = make_model(c, 20261203);
    EXPECT_TRUE(m->set_memory_policy(policy));
    run_family(rec, "hybrid", *m);
    if (policy.saved == SavedDtype::F32)
      run_hybrid_double(rec, *m, policy);  // bf16 staging: float model only
  }
  return rec;
}

std::string hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

const char* lib_name(GemmLib lib) { return lib == GemmLib::OpenBLAS ? "openblas" : "onednn"; }

// Every row of `got` has the bits of the same row of `want`; the first 40 differences are named.
void expect_same_bits(const Record& want, const Record& got, const std::string& what) {
  ASSERT_EQ(want.rows.size(), got.rows.size()) << what;
  ASSERT_GT(want.rows.size(), 100u) << what << ": the record covers every tensor";
  int bad = 0;
  for (size_t i = 0; i < want.rows.size(); ++i) {
    ASSERT_EQ(want.rows[i].first, got.rows[i].first) << what << ", row " << i;
    if (want.rows[i].second != got.rows[i].second && ++bad <= 40)
      ADD_FAILURE() << what << ": " << got.rows[i].first << " bits changed (" << hex(want.rows[i].second)
                    << " -> " << hex(got.rows[i].second) << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.rows.size() << " hashes differ";
}

// The GEMM libraries of this build: OpenBLAS always, oneDNN (the `auto` choice on AVX-512 CPUs) too.
std::vector<GemmLib> gemm_libs() { return {GemmLib::OpenBLAS, GemmLib::OneDNN}; }

TEST(ModelBitwise, RematChangesNoBit) {
  for (GemmLib lib : gemm_libs()) {
    const Record none = compute({Remat::None, SavedDtype::F32}, lib);
    expect_same_bits(none, compute({Remat::Full, SavedDtype::F32}, lib),
                     std::string("remat full, ") + lib_name(lib));
    expect_same_bits(none, compute({Remat::Attn, SavedDtype::F32}, lib),
                     std::string("remat attn, ") + lib_name(lib));
  }
}

TEST(ModelBitwise, Bf16StagingRepeats) {
  // (Under bf16 staging, remat attn re-runs the mixers from their bf16-rounded inputs, so it is not bitwise
  // equal to none there: docs/model.md "bf16 saved activations".)
  for (const Remat remat : {Remat::None, Remat::Attn}) {
    const MemoryPolicy bf16{remat, SavedDtype::BF16};
    expect_same_bits(compute(bf16), compute(bf16),
                     std::string("saved_dtype bf16, remat ") + remat_name(remat));
  }
  const Record a = compute({Remat::None, SavedDtype::BF16});
  // The staging does change numbers (it is not a no-op): the gradients differ from the fp32-saved run's.
  const Record f32 = compute();
  size_t differ = 0;
  for (size_t i = 0; i < a.rows.size(); ++i)
    differ += a.rows[i].second != f32.rows[i].second;  // f32 has more rows
  EXPECT_GT(differ, 10u) << "saved_dtype bf16 gave the fp32 run's bits: the staging rounds nothing";
}

// Under compute.dtype=bf16 the decoder rounds each group's weights once per call (kernels/gemm.h
// Bf16Weights) and keeps the buffers between calls: weights changed between two calls (as by an optimizer
// step) are read at their new values, bit for bit as by a fresh model; with residency hooks (fully sharded:
// copies live from need to done) the same bits again.
TEST(ModelBitwise, Bf16ComputeReadsWeightsChangedBetweenCalls) {
  std::string why;
  if (!onednn_bf16_supported(&why))
    GTEST_SKIP() << "skipped: this CPU has no oneDNN bf16 matmul (" << why << ")";
  set_threads(1);
  const ScopedCpuGemm pin({GemmLib::OneDNN, ComputeDtype::BF16});
  const ModelConfig c = load_config(std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3moe_tiny/config.json");
  const PackedBatch& a = batch_a(c.vocab_size);
  const LossConfig lc = loss_config();
  auto nudge = [](CausalLM& m) {
    for (auto& p : m.params())
      if (p.value.ndim() == 2)
        for (int64_t i = 0; i < p.value.numel(); i += 3) p.value.data<float>()[i] *= 1.5f;
  };
  auto step = [&](CausalLM& m) {
    for (auto& p : m.params()) std::fill_n(p.grad.data<float>(), p.grad.numel(), 0.0f);
    Record r;
    r.parts("fb", m.forward_backward(a.batch(), lc, 1.0 / 97.0, 0.5));
    for (auto& p : m.params()) r.add("grad." + p.name, hash_of(p.grad.data<float>(), p.grad.numel()));
    return r;
  };
  auto fresh = make_model(c, 20261203);
  nudge(*fresh);
  const Record want = step(*fresh);
  auto reused = make_model(c, 20261203);
  const Record before = step(*reused);  // rounds the first values and keeps the buffers
  nudge(*reused);
  expect_same_bits(want, step(*reused), "bf16 compute, weights changed after a call");
  auto hooked = make_model(c, 20261203);
  ASSERT_TRUE(hooked->set_param_residency({[](int) {}, [](int) {}}));
  step(*hooked);
  nudge(*hooked);
  expect_same_bits(want, step(*hooked), "bf16 compute with residency hooks");
  size_t differ = 0;
  for (size_t i = 0; i < want.rows.size(); ++i) differ += want.rows[i].second != before.rows[i].second;
  EXPECT_GT(differ, 10u) << "the nudge changed no result: the test would not see stale copies";
}

// The comparisons are only meaningful if a run is deterministic. With OLMOSFT_BITWISE_DUMP=FILE the hashes
// (both GEMM libraries, remat none, 1 thread) are also written to FILE for scripts/bitwise-compare.sh.
TEST(ModelBitwise, Repeatable) {
  for (GemmLib lib : gemm_libs()) {
    const Record a = compute({}, lib);
    expect_same_bits(a, compute({}, lib), std::string("repeated, ") + lib_name(lib));
    if (const char* dump = std::getenv("OLMOSFT_BITWISE_DUMP")) {
      std::ofstream f(dump, lib == GemmLib::OpenBLAS ? std::ios::trunc : std::ios::app);
      for (const auto& [k, h] : a.rows) f << lib_name(lib) << "." << k << " " << hex(h) << "\n";
      ASSERT_TRUE(f.good()) << "cannot write " << dump;
    }
  }
}

}  // namespace
