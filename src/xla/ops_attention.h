// StableHLO emitters for blockwise causal softmax attention over one packed row, forward and backward, with
// the semantics of kernels/attention.h (document masking by segment id, padding, sliding window, GQA):
//
//   query i sees key j iff seg[i] >= 0, seg[j] == seg[i], j <= i, and (window <= 0 or i - j < window)
//   s_ij = (scale q_i) . k_j   (q pre-scaled, as the CPU kernel),   lse_i = log sum_j exp(s_ij)
//   out_i = sum_j exp(s_ij - lse_i) v_j;  a query that sees no key (padding) gets out 0 and lse -inf
//   backward (FlashAttention-2): p_ij = exp(s_ij - lse_i), D_i = rowsum(dout_i * out_i),
//     dv_j = sum_i p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - D_i),  dq_i = scale sum_j ds_ij k_j,
//     dk_j = scale sum_i ds_ij q_i
//
// Both passes work on blocks of `block` queries and `block` keys. The forward loops over query blocks and,
// for each, runs a stablehlo.while over the key blocks it can see (from the first inside the sliding window,
// 0 without one, to its own: causal), keeping a running max, sum and output per (head, query) and rescaling
// them block by block (online softmax). The backward (FlashAttention-2 order) loops over key blocks and, for
// each, over the query blocks that can see it, recomputing the probabilities from q, k and lse, accumulating
// the block's dk and dv and adding into dq. Blocks wholly above the diagonal or outside the window are never
// computed; masks inside a block handle the rest (documents, padding). Memory: the inputs, the outputs and a
// dq accumulator (linear in T) plus the [H, block, block] scores and probabilities of one step: never T x T.
// T need not be a multiple of block (the tokens are padded with segment -1 inside the graph). All arithmetic
// is f32; with `operands` kBF16 (compute.dtype bf16) the five products take bf16 operands with f32
// accumulation, as cuDNN's flash attention does: scale * q, k, v and dout rounded once (nearest even), the
// probabilities P and the score gradients dS rounded before the products that read them (P V, P^T dO,
// dS K, dS^T q); maxima, exponentials, sums and lse stay f32.
//
// Shapes: q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv] (f32), seg [T] (s32); H a multiple of Hkv (kv head j
// serves q heads j*G .. j*G+G-1); out [T, H, Dv], lse [H, T]. With a leading batch dimension (q [B, T, H, D],
// k, v, dout likewise, seg [B, T], lse [B, H, T]: the CPU kernel's layouts) the B packed rows are independent
// and run one after the other in a stablehlo.while.
#pragma once
#include <cstdint>

#include "xla/hlo_builder.h"
#include "xla/mesh.h"
#include "xla/ops_dense.h"

namespace olmosft::xla::ops {

struct AttentionOptions {
  double scale = 0.0;                  // softmax scale (the model passes D^-0.5); must be finite
  int64_t window = 0;                  // sliding window W; <= 0: full causal
  int64_t block = 64;                  // keys per block (as kernels' kAttnBlockK)
  Operands operands = Operands::kF32;  // kBF16: the products' operands rounded to bf16 (blockwise only)
  // The program's device mesh (xla/mesh.h), or null: with more than one device the batched operands are row
  // tiles [B * C, T / C, ...] in the mesh's blocked order, each device attends its own tiles' queries
  // against their whole rows (context parallelism; ops_attention.cpp "over a device mesh").
  const Mesh* mesh = nullptr;
};

struct AttentionForward {
  Value out, lse;
};
AttentionForward attention_forward(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                   const Value& seg, const AttentionOptions& o);

struct AttentionBackward {
  Value dq, dk, dv;
};
// OUT and LSE: the forward's on the same inputs; DOUT [T, H, Dv].
AttentionBackward attention_backward(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                     const Value& seg, const Value& out, const Value& lse, const Value& dout,
                                     const AttentionOptions& o);

}  // namespace olmosft::xla::ops
