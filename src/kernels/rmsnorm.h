// RMSNorm over the last dimension, as HF Olmo3RMSNorm computes it (in fp32):
//   r = 1 / sqrt(mean(x^2) + eps),  y = w * (x * r)      (w optional: y = x * r)
// Backward (docs/reference/architecture.md A.6), with g = w * dy:
//   dx = r * (g - x * r^2 * mean(x * g)),   dw += sum_rows dy * x * r
// Row sums are accumulated in double for both instantiations; dw partial sums use a fixed row
// blocking, so results are bitwise identical for any thread count.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace olmosft {

// x, y: [N, D] contiguous; w: [D] or nullptr; rstd: [N] output (the r per row, saved for backward) or
// nullptr.
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t D, double eps);

// dy, x, dx: [N, D]; dx is overwritten. dw ([D]) is accumulated when both w and dw are non-null.
// rstd: the forward's saved r, or nullptr to recompute it from x and eps.
template <typename T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t N, int64_t D,
                      double eps);

// Grouped gains: row i uses the gains w + (i % G) * D (w holds G * D values; G = 1 is the plain form), as
// a per-head q/k norm with its own gains per head (rows = token x head). dw ([G * D]) is accumulated.
template <typename T>
void rmsnorm_forward_grouped(const T* x, const T* w, int64_t G, T* y, T* rstd, int64_t N, int64_t D,
                             double eps);
template <typename T>
void rmsnorm_backward_grouped(const T* dy, const T* x, const T* w, int64_t G, const T* rstd, T* dx, T* dw,
                              int64_t N, int64_t D, double eps);

// Tensor overloads (F32/F64, contiguous, x [..., D]); w, rstd, dw may be undefined Tensors.
void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, double eps);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                      Tensor& dw, double eps);

}  // namespace olmosft
