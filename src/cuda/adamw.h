// Global-norm clipping and AdamW over many tensors in a few launches (issue 15 item 2), with the semantics of
// src/kernels/adamw.h (torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW):
//   norm = sqrt(sum of g^2 over all tensors);  coef = min(1, max_norm / (norm + 1e-6));  g *= float(coef)
//   (when max_norm > 0 and coef < 1);  per tensor:  p *= 1 - lr * wd (wd = 0 unless decay)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) +
//   eps)
// fp32 master weights p, fp32 g, m, v; optionally the updated p rounded to a bf16 copy (the weights the next
// forward reads). The tensors are cut into fixed chunks of kChunk elements; the chunk table is uploaded
// once. The norm: one block per chunk sums g^2 in double (fixed tree), then one block adds the chunk sums in
// chunk order (fixed tree): deterministic, independent of scheduling. Launches: norm 2, clip 1 (the scale
// factor stays on the device), AdamW 1, whatever the number of tensors.
// The per-element arithmetic is the CPU kernel's fp32 sequence with explicitly rounded operations (no fused
// multiply-adds), so it differs from the CPU only where the host compiler contracts (or not) the same way.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/check.h"
#include "kernels/adamw_config.h"

namespace olmosft::cuda {

struct AdamWTensor {
  float* p = nullptr;          // fp32 master parameter
  float* g = nullptr;          // fp32 gradient (scaled in place by the clip)
  float* m = nullptr;          // first moment (zero-initialised by the caller)
  float* v = nullptr;          // second moment (zero-initialised by the caller)
  uint16_t* p_bf16 = nullptr;  // optional: receives bf16(p) after the update
  int64_t n = 0;
  bool decay = true;
};

// The shared hyperparameters (kernels/adamw_config.h, the CPU optimizer's; one set of defaults), under their
// old name here too. step() checks them itself (std::invalid_argument; AdamWConfig::validate is in
// olmosft_lib).
using ::olmosft::AdamWConfig;

class MultiTensorAdamW {
 public:
  static constexpr int64_t kChunk = int64_t(1) << 16;
  // Validates the tensors (std::invalid_argument naming the index) and uploads the chunk table.
  explicit MultiTensorAdamW(const std::vector<AdamWTensor>& tensors);

  // Pre-clip global norm (synchronizes to return it); throws std::runtime_error when it is not finite (no
  // gradient is then changed). max_norm <= 0: no clipping, only the norm.
  double clip_grad_norm(double max_norm, cudaStream_t stream = nullptr);
  // One AdamW update of every tensor; step is 1-based. Throws std::invalid_argument on a bad config.
  void step(const AdamWConfig& cfg, int64_t step, cudaStream_t stream = nullptr);

  int64_t chunks() const { return nchunks_; }

 private:
  int64_t nchunks_ = 0;
  std::vector<AdamWTensor> tensors_;
  DeviceArray<AdamWTensor> dtensors_;
  DeviceArray<int32_t> chunk_tensor_;  // [nchunks] tensor index
  DeviceArray<int64_t> chunk_offset_;  // [nchunks] first element
  DeviceArray<double> partial_;        // [nchunks] sums of squares
  DeviceArray<double> norm_;           // [1]
};

}  // namespace olmosft::cuda
