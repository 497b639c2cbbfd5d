// The cross-entropy kernels' configuration and result types, shared by the CPU kernel
// (kernels/cross_entropy.h) and the CUDA one (cuda/xent.h): one definition, one set of defaults. Header-only
// and dependency-free, so that src/cuda (beside kernels, built without olmosft_lib on the GPU machine) can
// include it. Semantics of each field: kernels/cross_entropy.h; where the CUDA kernel reads a field
// differently, cuda/xent.h says so.
#pragma once
#include <cstdint>

namespace olmosft {

struct XentConfig {
  int64_t valid_vocab = 0;     // rows of W in the softmax (<= V_rows); required
  double z_loss = 0.0;         // z-loss coefficient (e.g. 1e-5); used by the backward
  int64_t vocab_chunk = 4096;  // vocab columns per tile; 0 = whole vocab
  int64_t row_block = 1024;    // trained tokens per tile; 0 = all
  int32_t ignore_index = -100;
};

struct XentStats {
  double ce_sum = 0;  // sum over trained tokens of (lse - logit[target])
  double z_sum = 0;   // sum over trained tokens of lse^2 (not multiplied by z_loss)
  int64_t count = 0;  // trained tokens
};

}  // namespace olmosft
