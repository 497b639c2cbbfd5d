// StableHLO emitters for the LM head fused with softmax cross-entropy and z-loss, tiled over the vocabulary,
// with the semantics of kernels/cross_entropy.h:
//
//   trained_i = mask_i != 0 && target_i != ignore_index;  logits = h W^T over rows j < valid_vocab of W
//   lse_i = logsumexp_j logit_ij,  ce = sum_trained (lse_i - logit_i,target_i),  z = sum_trained lse_i^2
//   backward of  loss = scale * (ce + z_loss * z):
//     dlogit_ij = scale * (p_ij (1 + 2 z_loss lse_i) - [j == target_i])  (0 for untrained rows)
//     dh = dlogit W,  dW = dlogit^T h
//
// Both passes loop (stablehlo.while) over tiles of `vocab_chunk` rows of W with all N tokens at once: the
// forward keeps a running max and rescaled sum per token (online logsumexp) and picks the target's logit as
// its tile passes; the backward recomputes each tile's logits from h, W and lse and adds its dh and writes
// its dW rows, so the [N, V] logits (or their gradient) never exist: the largest temporary is [N, chunk]
// (and W is read in place, never copied).
// W may have padded rows (V_rows > valid_vocab): they take no part and get zero gradient. All f32.
//
// Shapes: h [N, d], W [V_rows, d] (f32), targets [N] (s32), mask [N] (s32, 0 = untrained).
#pragma once
#include <cstdint>

#include "xla/hlo_builder.h"
#include "xla/mesh.h"
#include "xla/ops_dense.h"

namespace olmosft::xla::ops {

struct XentOptions {
  int64_t valid_vocab = 0;     // rows of W in the softmax (<= V_rows); required
  double z_loss = 0.0;         // z-loss coefficient (used by the backward)
  int64_t vocab_chunk = 4096;  // vocab rows per tile; 0 = the whole vocabulary at once
  int32_t ignore_index = -100;
  // kBF16: the operands of the three products (logits = h W^T, dh = dlogit W, dW = dlogit^T h) rounded to
  // bf16 and accumulated in f32, as the kernel's Precision::Compute GEMMs under ComputeDtype::BF16.
  Operands operands = Operands::kF32;
  // The program's device mesh (null or one device: none). With N over its devices (xla/mesh.h's blocked token
  // order), the backward's tile loop runs on each device's own tokens in a manual region and each device's
  // partial dW is summed over the devices once, after the loop: left to the SPMD partitioner, the whole
  // [V_rows, d] gradient was all-reduced in every tile (xla/hlo_loops.h found it).
  const Mesh* mesh = nullptr;
};

struct XentForward {
  Value ce_sum, z_sum;  // f32 scalars: sums over trained tokens (z_sum not multiplied by z_loss)
  Value count;          // s32 scalar: trained tokens
  Value lse;            // f32 [N]: per-token logsumexp, 0 for untrained tokens (as the CPU kernel)
};
XentForward xent_forward(HloBuilder& b, const Value& h, const Value& w, const Value& targets,
                         const Value& mask, const XentOptions& o);

struct XentBackward {
  Value dh;  // [N, d], 0 for untrained tokens
  Value dw;  // [V_rows, d], rows >= valid_vocab 0 (the CPU kernel accumulates into dW; this is the term)
};
// SCALE: f32 scalar (e.g. 1 / global trained-token count), a runtime value so it needs no recompile.
XentBackward xent_backward(HloBuilder& b, const Value& h, const Value& w, const Value& targets,
                           const Value& mask, const Value& lse, const Value& scale, const XentOptions& o);

}  // namespace olmosft::xla::ops
