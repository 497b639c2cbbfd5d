// Per-layer device kernels (issue 15 item 2), forward and backward side by side like src/kernels/*.h, with
// the CPU kernels' semantics: RMSNorm (kernels/rmsnorm.h), SwiGLU (kernels/swiglu.h), RoPE/YaRN application
// (kernels/rope.h) and the token embedding. Activations and weights are bf16 (uint16_t bit patterns),
// arithmetic is fp32, weight gradients are fp32 and accumulated (+=). All pointers are device memory; each
// call enqueues on `stream` and returns without synchronizing. Every reduction has a fixed order (no float
// atomics), so two runs on the same inputs give bitwise identical results.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/check.h"

namespace olmosft::cuda {

// RMSNorm over rows of D: r = 1 / sqrt(mean(x^2) + eps) (sum of squares in fp32, one block per row),
// y = bf16(w * (x * r)) (w may be null: y = bf16(x * r)). rstd [N] (fp32, may be null) saves r.
void rmsnorm_forward(const uint16_t* x, const uint16_t* w, uint16_t* y, float* rstd, int64_t N, int64_t D,
                     float eps, cudaStream_t stream = nullptr);
// g = w * dy;  dx = bf16(r * g - x * (r^3 * mean(x * g)));  dw += sum_rows dy * x * r (fp32, when w and dw
// are given). rstd may be null (recomputed from x and eps). dw needs `workspace`: at least
// rmsnorm_backward_workspace(N, D) floats (per-row-block partial sums, added in block order).
void rmsnorm_backward(const uint16_t* dy, const uint16_t* x, const uint16_t* w, const float* rstd,
                      uint16_t* dx, float* dw, float* workspace, int64_t N, int64_t D, float eps,
                      cudaStream_t stream = nullptr);
int64_t rmsnorm_backward_workspace(int64_t N, int64_t D);

// h = bf16(silu(a) * b) over N rows of F, rows at multiples of the leading dimensions (a fused gate|up
// projection [N, 2F] is a = p, b = p + F, lda = ldb = 2F). silu(a) = a / (1 + exp(-a)).
void swiglu_forward(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* h, int64_t ldh,
                    int64_t N, int64_t F, cudaStream_t stream = nullptr);
// s = sigmoid(a): db = bf16(dh * a * s), da = bf16(dh * b * s * (1 + a * (1 - s))); either may be null.
void swiglu_backward(const uint16_t* dh, int64_t lddh, const uint16_t* a, int64_t lda, const uint16_t* b,
                     int64_t ldb, uint16_t* da, int64_t ldda, uint16_t* db, int64_t lddb, int64_t N,
                     int64_t F, cudaStream_t stream = nullptr);

// In-place rotate-half RoPE of x: ntok tokens of H heads of D values, token t at x + t * ld_tok, head h at
// + h * D. cos/sin: fp32 tables [ntok, D/2] built on the host by kernels/rope.h's rope_tables<float> (they
// carry the YaRN attention scaling). Forward [a, b] -> [a c - b s, b c + a s]; backward (the transpose)
// [a, b] -> [a c + b s, b c - a s]; fp32 arithmetic, one bf16 rounding per output.
void rope_forward(uint16_t* x, const float* cos, const float* sin, int64_t ntok, int64_t H, int64_t D,
                  int64_t ld_tok, cudaStream_t stream = nullptr);
void rope_backward(uint16_t* dx, const float* cos, const float* sin, int64_t ntok, int64_t H, int64_t D,
                   int64_t ld_tok, cudaStream_t stream = nullptr);

// Token embedding for one batch. Built on the host from the host's token ids (the data loader has them
// there): validates every id against the vocabulary (std::invalid_argument naming the position), uploads
// the ids, and, for the backward, the positions sorted by (token, position) and the start of each token's
// run. The gradient of row v is then the sum over v's positions in ascending order, by one block that owns
// row v: deterministic, no atomics.
class EmbeddingBatch {
 public:
  EmbeddingBatch(const std::vector<int32_t>& tokens, int64_t vocab);
  int64_t size() const { return ntok_; }
  int64_t unique_tokens() const { return nruns_; }
  const int32_t* device_tokens() const { return tokens_.data(); }

  // out[t, :] = table[token[t], :] (bf16 rows of d).
  void forward(const uint16_t* table, uint16_t* out, int64_t d, cudaStream_t stream = nullptr) const;
  // dtable[v, :] += sum over t with token[t] == v, ascending t, of dout[t, :] (fp32 accumulation into the
  // fp32 gradient dtable [vocab, d]; rows of tokens not in the batch untouched).
  void backward(const uint16_t* dout, float* dtable, int64_t d, cudaStream_t stream = nullptr) const;

 private:
  int64_t ntok_ = 0, nruns_ = 0;
  DeviceArray<int32_t> tokens_, sorted_pos_, run_start_;  // run_start_: nruns_ + 1 offsets into sorted_pos_
};

}  // namespace olmosft::cuda
