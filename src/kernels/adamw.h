// Global-norm gradient clipping and AdamW, with the semantics of torch.nn.utils.clip_grad_norm_ and
// torch.optim.AdamW (PyTorch 1.13, single-tensor path):
//   clip:  norm = sqrt(sum over all grads of g^2)  (accumulated in double)
//          coef = min(1, max_norm / (norm + 1e-6));  g *= coef   (skipped when max_norm <= 0)
//   AdamW, step t (1-based), per parameter tensor with its own weight-decay switch:
//          p *= 1 - lr * wd
//          m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//          p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#pragma once
#include <cstdint>
#include <vector>

namespace olmosft {

// AdamW's hyperparameters, with torch.optim.AdamW's defaults.
struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // Throws olmosft::Error naming the bad field.
  void validate() const;
};

template <typename T>
struct AdamWParam {
  T* p = nullptr;     // parameter
  T* g = nullptr;     // gradient (read; scaled in place by the clip)
  T* m = nullptr;     // first moment (zero-initialised by the caller)
  T* v = nullptr;     // second moment (zero-initialised by the caller)
  int64_t n = 0;      // elements
  bool decay = true;  // apply weight decay to this tensor
};

// sum g[i]^2 in double, in a fixed order that vectorises: eight running sums (element i into sum i % 8),
// then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). The same bits for a given n on any machine (a
// float's square is exact in double, so a fused multiply-add rounds as the separate add does).
double sum_of_squares(const float* g, int64_t n);

// Sum of squares of all gradients, sqrt'ed (the pre-clip global norm): each tensor's sum over a fixed
// blocking (at most 64 blocks of at least 4,096 elements, each block's sum_of_squares), the blocks added
// in order; so the same bits for any thread count.
template <typename T>
double global_grad_norm(const std::vector<AdamWParam<T>>& params);

// Computes the global norm, scales every gradient by min(1, max_norm / (norm + 1e-6)) when max_norm > 0,
// and returns the PRE-clip norm (as torch.nn.utils.clip_grad_norm_ does). A non-finite norm throws.
template <typename T>
double clip_grad_norm(std::vector<AdamWParam<T>>& params, double max_norm);

// clip_grad_norm's coefficient for a norm: min(1, max_norm / (norm + 1e-6)), or 1 when max_norm <= 0.
double clip_coefficient(double norm, double max_norm);

// One AdamW update of every tensor; `step` is the 1-based step count (after increment, as torch's state).
// The gradients are read as g * grad_scale (each product rounded to T), which gives the bits of scaling g
// in place by the clip's coefficient first, without the pass that writes g; g itself is left as it is.
template <typename T>
void adamw_step(std::vector<AdamWParam<T>>& params, const AdamWConfig& cfg, int64_t step,
                T grad_scale = T(1));

}  // namespace olmosft
