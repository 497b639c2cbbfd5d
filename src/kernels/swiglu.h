// SwiGLU activation: h = silu(a) * b, silu(a) = a * sigmoid(a) (a = gate projection, b = up projection).
// Backward (docs/reference/architecture.md A.6): db = dh * silu(a),  da = dh * b * s * (1 + a * (1 - s)),  s
// = sigmoid(a).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace olmosft {

// Row-strided form: N rows of F elements; a, b, h, da, db rows start at multiples of their leading
// dimensions (so a fused gate|up projection [N, 2F] can be passed as a = p, b = p + F, ld = 2F).
template <typename T>
void swiglu_forward(const T* a, int64_t lda, const T* b, int64_t ldb, T* h, int64_t ldh, int64_t N,
                    int64_t F);
// da and db are overwritten (either may be nullptr to skip it).
template <typename T>
void swiglu_backward(const T* dh, int64_t lddh, const T* a, int64_t lda, const T* b, int64_t ldb, T* da,
                     int64_t ldda, T* db, int64_t lddb, int64_t N, int64_t F);

// Contiguous forms over n elements.
template <typename T>
void swiglu_forward(const T* a, const T* b, T* h, int64_t n) {
  swiglu_forward(a, n, b, n, h, n, 1, n);
}
template <typename T>
void swiglu_backward(const T* dh, const T* a, const T* b, T* da, T* db, int64_t n) {
  swiglu_backward(dh, n, a, n, b, n, da, n, db, n, 1, n);
}

// Tensor overloads: all same shape, contiguous, F32/F64.
void swiglu_forward(const Tensor& a, const Tensor& b, Tensor& h);
void swiglu_backward(const Tensor& dh, const Tensor& a, const Tensor& b, Tensor& da, Tensor& db);

}  // namespace olmosft
