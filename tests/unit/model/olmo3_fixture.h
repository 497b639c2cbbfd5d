// The Olmo 3 tiny fixture (tests/golden/model/olmo3_tiny: made by tests/reference with PyTorch in float64):
// its batch, outputs, gradients and expected.json, read once per test binary. Shared by the CPU backend's
// tests (model_olmo3_test.cpp) and the XLA backend's (decoder_xla_test.cpp).
#pragma once
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"
#include "model/model.h"

namespace olmosft::model::test {

inline const std::string kOlmo3TinyDir = std::string(OLMOSFT_GOLDEN_DIR) + "/model/olmo3_tiny";

struct Olmo3Fixture {
  std::shared_ptr<safetensors::Reader> batch, out, grads;
  Tensor ids, seg, pos, targets, mask;
  int64_t B = 0, T = 0;
  nlohmann::json expected;
  Olmo3Fixture() {
    batch = safetensors::Reader::open(kOlmo3TinyDir + "/batch.safetensors");
    out = safetensors::Reader::open(kOlmo3TinyDir + "/outputs.safetensors");
    grads = safetensors::Reader::open(kOlmo3TinyDir + "/grads.safetensors");
    ids = batch->copy("input_ids");
    seg = batch->copy("segment_ids");
    pos = batch->copy("position_ids");
    targets = batch->copy("targets");
    mask = batch->copy("loss_mask");
    B = ids.size(0);
    T = ids.size(1);
    std::ifstream f(kOlmo3TinyDir + "/expected.json");
    expected = nlohmann::json::parse(f);
  }
  // WITH_POSITIONS false: the model derives the positions from the segments (restarting per document).
  Batch make(bool with_positions = true) const {
    Batch b;
    b.B = B;
    b.T = T;
    b.tokens = ids.data<int32_t>();
    b.segments = seg.data<int32_t>();
    b.positions = with_positions ? pos.data<int32_t>() : nullptr;
    b.targets = targets.data<int32_t>();
    b.trained = mask.data<uint8_t>();
    return b;
  }
  int64_t trained() const { return expected["batch"]["n_trained_targets"].get<int64_t>(); }
};

inline const Olmo3Fixture& olmo3_fixture() {
  static const Olmo3Fixture f;
  return f;
}

}  // namespace olmosft::model::test
