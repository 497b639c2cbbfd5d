// Shared helpers for the Olmo Hybrid (olmo_hybrid, Gated DeltaNet) tests: a tiny random model in float64
// storage (the preset olmo-hybrid-tiny cut to LAYERS layers, norm gains 1 + 0.2 N(0,1) so they matter) and a
// packed batch (row 0: one document; row 1: two).
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/threads.h"
#include "double_model.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/params.h"
#include "train/batch.h"

namespace olmo_hybrid_test {

using namespace olmosft;
using namespace olmosft::model;

inline const bool kSingleThreaded = (olmosft::set_threads(1), true);

using testutil::DoubleModel;

inline DoubleModel random_model(const ModelConfig& c, uint64_t seed) {
  std::vector<Param> params = allocate_params(c);
  init_params(params, c, seed);
  DoubleModel m;
  m.config = c;
  const Rng rng{seed + 1, 7};
  uint64_t k = 0;
  for (const Param& p : params) {
    m.names.push_back(p.name);
    const float* v = p.value.data<float>();
    std::vector<double> w(v, v + p.value.numel());
    const bool gain = p.name.size() > 11 && p.name.compare(p.name.size() - 11, 11, "norm.weight") == 0;
    if (gain)
      for (double& x : w) x = 1.0 + 0.2 * rng.normal(k++);
    if (p.name.ends_with("dt_bias"))
      for (double& x : w) x = 0.5 * rng.normal(k++);
    if (p.name.ends_with("A_log"))  // decays exp(-A softplus(.)) with A ~ 0.37: the state reaches far
      for (double& x : w) x = -1.0 + 0.3 * rng.normal(k++);
    m.w.push_back(std::move(w));
    m.g.emplace_back(m.w.back().size(), 0.0);
  }
  return m;
}

inline ModelConfig tiny_config(int64_t layers = 4, bool nope = false, bool neg_eigval = true) {
  nlohmann::json j = preset_config_json("olmo-hybrid-tiny");
  j["num_hidden_layers"] = layers;
  j["layer_types"].erase(j["layer_types"].begin() + layers, j["layer_types"].end());
  if (nope) j["rope_parameters"]["rope_theta"] = nullptr;
  j["linear_allow_neg_eigval"] = neg_eigval;
  return parse_config(j, "olmo-hybrid-tiny test config");
}

struct PackedBatch {
  int64_t B = 2, T = 40;
  std::vector<int32_t> tokens, segments, positions, targets;
  std::vector<uint8_t> trained;
  // doc_lengths per row (each row's lengths sum to T)
  explicit PackedBatch(const std::vector<std::vector<int64_t>>& rows, int64_t vocab, uint64_t seed = 5) {
    B = static_cast<int64_t>(rows.size());
    T = 0;
    for (int64_t n : rows[0]) T += n;
    const Rng rng{seed, 3};
    uint64_t k = 0;
    for (const auto& docs : rows) {
      int32_t seg = 0;
      for (int64_t n : docs) {
        ++seg;
        for (int64_t t = 0; t < n; ++t) {
          tokens.push_back(static_cast<int32_t>(rng.below(k++, static_cast<uint64_t>(vocab - 2))));
          segments.push_back(seg);
          positions.push_back(static_cast<int32_t>(t));
        }
        for (int64_t t = 0; t < n; ++t) {
          const size_t i = tokens.size() - static_cast<size_t>(n) + static_cast<size_t>(t);
          targets.push_back(t + 1 < n ? tokens[i + 1] : -100);
          trained.push_back(t + 1 < n ? 1 : 0);
        }
      }
    }
  }
  Batch batch() const { return train::batch_view(B, T, tokens, segments, positions, targets, trained); }
  double trained_count() const {
    double n = 0;
    for (uint8_t t : trained) n += t;
    return n;
  }
};

}  // namespace olmo_hybrid_test
