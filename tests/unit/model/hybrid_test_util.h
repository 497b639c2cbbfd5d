// Shared helpers for the hybrid (olmo3moe) tests: the D.2 tiny fixture loaded into fp32 / fp64 storage.
#pragma once
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/threads.h"
#include "double_model.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/hf_dir.h"
#include "model/params.h"
#include "train/batch.h"

namespace hybrid_test {

using namespace olmosft;
using namespace olmosft::model;

// The fixture is tiny (128 tokens): one thread. On the shared, loaded test machine the OpenMP fork/join
// of the many tiny parallel regions made 2 threads ~15x slower. HybridFixture.ThreadCountsAgree runs the
// multi-threaded path.
inline const bool kSingleThreaded = (olmosft::set_threads(1), true);

inline std::string fixture_dir() { return std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3moe_tiny"; }

struct FixtureBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, segments, positions, targets;
  std::vector<uint8_t> trained;
  Batch batch() const {
    return olmosft::train::batch_view(B, T, tokens, segments, positions, targets, trained);
  }
};

template <typename T>
std::vector<T> to_vec(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<T> v(static_cast<size_t>(c.numel()));
  if (c.dtype() == DType::F32) {
    const float* p = c.data<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(p[i]);
  } else if (c.dtype() == DType::I32) {
    const int32_t* p = c.data<int32_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(p[i]);
  } else if (c.dtype() == DType::U8) {
    const uint8_t* p = c.data<uint8_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(p[i]);
  } else {
    throw std::runtime_error("to_vec: unsupported dtype");
  }
  return v;
}

inline FixtureBatch load_batch() {
  auto r = safetensors::Reader::open(fixture_dir() + "/batch.safetensors");
  FixtureBatch fb;
  Tensor ids = r->copy("input_ids");
  fb.B = ids.shape()[0];
  fb.T = ids.shape()[1];
  fb.tokens = to_vec<int32_t>(ids);
  fb.segments = to_vec<int32_t>(r->copy("segment_ids"));
  fb.positions = to_vec<int32_t>(r->copy("position_ids"));
  fb.targets = to_vec<int32_t>(r->copy("targets"));
  fb.trained = to_vec<uint8_t>(r->copy("loss_mask"));
  return fb;
}

// The fixture model as an Decoder (fp32 params loaded by name, as the factory's load_model does).
inline std::unique_ptr<Decoder> load_model_f32(const DecoderOptions& opts) {
  HfModel hf = load_hf_dir(fixture_dir());
  auto m = std::make_unique<Decoder>(hf.config, opts);
  for (auto& p : m->params()) p.value.copy_from(hf.at(p.name));
  return m;
}

using testutil::DoubleModel;  // fp64 copies of the weights in registry order

inline DoubleModel load_model_f64() {
  HfModel hf = load_hf_dir(fixture_dir());
  DoubleModel m;
  m.config = hf.config;
  for (const auto& s : hf.registry) {
    m.names.push_back(s.name);
    m.w.push_back(to_vec<double>(hf.at(s.name)));
    m.g.emplace_back(m.w.back().size(), 0.0);
  }
  return m;
}

}  // namespace hybrid_test
