// StableHLO emitters for global-norm gradient clipping and the AdamW update on f32 master weights and
// moments, with the formulas of kernels/adamw.{h,cpp} (torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW):
//   clip:  norm = sqrt(sum over all gradients of g^2),  coef = min(1, max_norm / (norm + 1e-6)),  g *= coef
//   AdamW: m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//          p = p keep - step_size * m / (sqrt(v) / bc2_sqrt + eps)
//   with, per step t (1-based), computed on the host in double and rounded to f32 as the CPU kernel does:
//          step_size = lr / (1 - beta1^t),  bc2_sqrt = sqrt(1 - beta2^t),  keep = 1 - lr * weight_decay
// (keep is 1 for a tensor without weight decay). The three are a runtime f32 [3] argument (adamw_scalars), so
// a learning-rate schedule and the step count need no recompile.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "xla/hlo_builder.h"

namespace olmosft::xla::ops {

struct AdamWOptions {
  double lr = 1e-3;  // only adamw_scalars reads it
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// {step_size, bc2_sqrt, keep} for 1-based STEP, exactly as kernels/adamw.cpp computes them.
std::array<float, 3> adamw_scalars(const AdamWOptions& o, int64_t step);

struct ClipResult {
  std::vector<Value> grads;  // clipped (unchanged when max_norm <= 0)
  Value norm;                // f32 scalar: the pre-clip global norm (the caller checks it is finite)
};
// GRADS: f32 tensors of any shapes.
ClipResult clip_grad_norm(HloBuilder& b, const std::vector<Value>& grads, double max_norm);

struct AdamWParam {
  Value p, g, m, v;  // f32, one shape
  bool decay = true;
};
struct AdamWState {
  Value p, m, v;
};
// SCALARS: f32 [3] from adamw_scalars. Returns the new p, m, v of each parameter (alias them to the
// arguments with HloBuilder::argument(type, result_index) to update in place).
std::vector<AdamWState> adamw_update(HloBuilder& b, const std::vector<AdamWParam>& params,
                                     const Value& scalars, const AdamWOptions& o);

}  // namespace olmosft::xla::ops
