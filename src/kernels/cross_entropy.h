// Softmax cross-entropy over the vocabulary, fused with the LM head and tiled in vocab chunks.
//
// Inputs: hidden states h [N, d] (after the final norm), lm_head W [V_rows, d] (nn.Linear layout),
// int32 targets [N], an optional uint8 trained mask [N]. Only rows j < valid_vocab of W take part in the
// softmax: padded rows (V_rows > valid_vocab) are excluded, as if their logits were -inf
// (docs/reference/architecture.md A.2: zero-padded rows would otherwise cost +3.2 nats/token), and get no
// gradient.
//
// A token is trained when (mask == nullptr || mask[i] != 0) && targets[i] != ignore_index. Untrained
// tokens are skipped entirely (no logits are computed for them; their dh is 0).
//
// Per trained token:  lse = logsumexp_j<valid (h W^T)_j,  ce = lse - logit[target],  z = lse^2.
// The forward returns SUMS over trained tokens (the caller divides by the global trained-token count,
// which spans micro-batches and ranks). The loss whose gradient xent_backward computes is
//     loss = scale * (ce_sum + z_loss * z_sum)
// so  dlogit_j = scale * (p_j * (1 + 2 z_loss lse) - [j == target]),  dh = dlogit W,  dW += dlogit^T h.
//
// Tiling: logits are produced `vocab_chunk` columns and `row_block` trained tokens at a time; the forward
// keeps an online logsumexp (running max and rescaled sum, in double) per token and saves only lse [N];
// the backward recomputes each chunk's logits. Peak extra memory is row_block * vocab_chunk values,
// never N x V. vocab_chunk = 0 (or >= valid_vocab) and row_block = 0 give the untiled computation.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace olmosft {

// The kernels' configuration and result; each field's meaning is in the comment above.
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

// lse: [N] output, the per-token logsumexp (0 for untrained tokens), needed by the backward.
template <typename T>
XentStats xent_forward(const T* h, const T* W, const int32_t* targets, const uint8_t* mask, int64_t N,
                       int64_t d, int64_t V_rows, const XentConfig& cfg, T* lse);

// dh [N, d] is overwritten; dW [V_rows, d] is accumulated (rows >= valid_vocab untouched). Either may be
// null.
template <typename T>
void xent_backward(const T* h, const T* W, const int32_t* targets, const uint8_t* mask, const T* lse,
                   int64_t N, int64_t d, int64_t V_rows, const XentConfig& cfg, double scale, T* dh, T* dW);

// The bytes xent_forward / xent_backward allocate besides their arguments (the tiles), at most, for
// `trained` trained tokens (T = float unless elem says otherwise): the trained-row list, plus the larger
// of the forward's tile (h rows, logits, running max/sum/target) and the backward's (h rows, logit
// gradients, dh rows). For planning (train/plan.h).
size_t xent_workspace_bytes(int64_t trained, int64_t d, const XentConfig& cfg, size_t elem = sizeof(float));

// Tensor overloads: h [N, d], W [V_rows, d] (F32/F64), targets I32 [N], mask U8 [N] or undefined, lse [N].
XentStats xent_forward(const Tensor& h, const Tensor& W, const Tensor& targets, const Tensor& mask,
                       const XentConfig& cfg, Tensor& lse);
void xent_backward(const Tensor& h, const Tensor& W, const Tensor& targets, const Tensor& mask,
                   const Tensor& lse, const XentConfig& cfg, double scale, Tensor& dh, Tensor& dW);

}  // namespace olmosft
