// Olmo Hybrid on XLA (device: xla, XLA's CPU plugin): the Gated DeltaNet unit and the pre-norm block emitted
// as StableHLO (unit_gdn.h, model/delta_rule_emit.h) against the CPU backend on transformers' own tiny model
// (tests/golden/model/hf_olmo_hybrid/rope_negeig: 3 GDN layers + 1 attention layer, 2 rows of 80 tokens, one
// with two packed documents), and against transformers' float64 run. Bounds: the CE sum within 1e-5 relative
// of the CPU backend's (docs/numerics.md "Two fp32 backends"; measured 1.2e-8); log-probs within 2e-5 of
// transformers' float64 ones, as the CPU backend's oracle test (measured 7.6e-6). Gradients: this model's
// float32 gradients sit ~3e-5 of the scale from the float64 truth in every implementation (transformers'
// own float32 run 3.6e-5, oracle.json; the CPU backend 2.7e-5; XLA 3.3e-5, measured), more than the Olmo 3
// fixture's 1e-5 policy bound allows between two of them; so each is held to 1e-4 of the scale against the
// truth and against the other (measured XLA vs CPU 4.1e-5). The delta rule runs both as the recurrence and
// chunked (xla.delta_chunk): chunked in 16s, XLA 4.7e-5 from the truth and 6.9e-5 from the CPU backend (the
// recurrence 3.3e-5 / 4.0e-5; the chunked form sums in another order, and this model's float32 gradients
// are that noisy), CE 7.7e-9 relative to the CPU backend's.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "../xla/xla_test_util.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/decoder_xla.h"
#include "model/hf_dir.h"
#include "train/batch.h"

using namespace olmosft;
using namespace olmosft::model;

namespace {

std::string case_dir(const std::string& c) {
  return std::string(OLMOSFT_GOLDEN_DIR) + "/model/hf_olmo_hybrid/" + c;
}

template <typename T>
std::vector<T> vec(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

double rel_error(const Tensor& got, const Tensor& want) {
  double scale = 1e-30, err = 0;
  const float *g = got.data<float>(), *w = want.data<float>();
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::fabs(double(w[i])));
  for (int64_t i = 0; i < want.numel(); ++i)
    err = std::max(err, std::fabs(double(g[i]) - double(w[i])) / scale);
  return err;
}

struct OracleBatch {
  std::shared_ptr<safetensors::Reader> r;
  explicit OracleBatch(const std::string& dir) : r(safetensors::Reader::open(dir + "/oracle.safetensors")) {
    for (int32_t y : tgt) trained.push_back(y != -100);
  }
  std::vector<int32_t> ids = vec<int32_t>(r->copy("input_ids")), seg = vec<int32_t>(r->copy("segment_ids")),
                       pos = vec<int32_t>(r->copy("position_ids")), tgt = vec<int32_t>(r->copy("targets"));
  std::vector<uint8_t> trained;
  std::vector<double> lp64 = vec<double>(r->copy("logprobs"));
  Batch batch() const { return train::batch_view(2, 80, ids, seg, pos, tgt, trained); }
};

// CHUNK: XLA's delta rule in chunks of that many tokens (0: the token-by-token recurrence).
void matches_cpu_and_transformers(const std::string& c, int64_t chunk) {
  const HfModel hf = load_hf_dir(case_dir(c));
  const OracleBatch o(case_dir(c));
  const Batch b = o.batch();
  XlaOptions xo;
  xo.delta_chunk = chunk;
  XlaDecoder x(hf.config, xo);
  Decoder cpu(hf.config, DecoderOptions{});
  for (auto& p : x.params()) p.value.copy_from(hf.at(p.name));
  for (auto& p : cpu.params()) p.value.copy_from(hf.at(p.name));
  const LossParts px = x.forward_backward(b, LossConfig{}, 1.0 / 157, 1.0);
  const LossParts pc = cpu.forward_backward(b, LossConfig{}, 1.0 / 157, 1.0);
  const double ce = std::fabs(px.sum[kLossCe] - pc.sum[kLossCe]) / std::fabs(pc.sum[kLossCe]);
  std::cout << "CE sum: relative difference " << ce << "\n";
  EXPECT_LT(ce, 1e-5);
  // Gradients: both backends against transformers' float64 autograd (the truth); this model's float32
  // gradients are noisier than Olmo 3's (transformers' own float32 run: up to 3.6e-5 of the scale,
  // oracle.json)
  double wx = 0, wc = 0, wxc = 0;
  for (size_t i = 0; i < x.params().size(); ++i) {
    const std::string& n = x.params()[i].name;
    const Tensor truth = o.r->copy("grad." + n);
    const double ex = rel_error(x.params()[i].grad, truth), ec = rel_error(cpu.params()[i].grad, truth),
                 exc = rel_error(x.params()[i].grad, cpu.params()[i].grad);
    wx = std::max(wx, ex), wc = std::max(wc, ec), wxc = std::max(wxc, exc);
    EXPECT_LT(ex, 1e-4) << n;
    EXPECT_LT(exc, 1e-4) << n;
  }
  std::cout << "gradients vs transformers' float64: XLA worst " << wx << ", CPU backend worst " << wc
            << " of the scale; XLA vs CPU worst " << wxc << "\n";
  std::vector<float> lp(160);
  x.forward(b, LossConfig{}, nullptr, lp.data());
  double gap = 0;
  for (size_t i = 0; i < lp.size(); ++i)
    if (o.tgt[i] != -100) gap = std::max(gap, std::fabs(double(lp[i]) - o.lp64[i]));
  std::cout << "log-probs vs transformers' float64 run: max |d| " << gap << "\n";
  EXPECT_LT(gap, 2e-5);
}

}  // namespace

TEST(GdnXla, RecurrentOlmoHybridMatchesTheCpuBackendAndTransformers) {
  matches_cpu_and_transformers("rope_negeig", 0);
}
// The chunked delta rule (xla.delta_chunk): chunks of 16 tokens, so rows of 80 are 5 chunks and the packed
// row's second document starts inside one.
TEST(GdnXla, ChunkedOlmoHybridMatchesTheCpuBackendAndTransformers) {
  matches_cpu_and_transformers("rope_negeig", 16);
}
// Grouped value heads (2 value heads per key head): q and k repeated in the graph, their gradients summed;
// the default chunk (64: one whole chunk and one of 16 real tokens padded with no-ops).
TEST(GdnXla, ChunkedGroupedValueHeadsMatchTheCpuBackendAndTransformers) {
  matches_cpu_and_transformers("gva", 64);
}
