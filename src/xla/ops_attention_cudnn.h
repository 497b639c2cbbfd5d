// cuDNN's fused (flash) attention as XLA's CUDA backend runs it: the StableHLO custom calls
// `__cudnn$fmhaSoftmax` (forward) and `__cudnn$fmhaSoftmaxBackward`, with the operands, layouts and JSON
// backend_config that JAX's `jax.nn.dot_product_attention(..., implementation="cudnn")` lowers to for the
// `cuda` platform (recorded by tests/reference/jax_cudnn_attention.py; xla_cudnn_attention_test compares).
// Only XLA's CUDA plugin can compile these calls (the CPU plugin and libtpu have no handler for them).
//
// Semantics: causal softmax attention of each row over all of its keys (no segments), optionally in a
// sliding window (query i sees key j iff j <= i and i - j < window), GQA (H a multiple of Hkv):
//   s_ij = scale q_i . k_j,  out_i = sum_j softmax_j(s_ij) v_j
// The operands are rounded to bf16 (cuDNN's flash attention takes bf16 or fp16) and the products summed in
// f32 inside cuDNN; OUT, DQ, DK and DV come back as bf16 and are returned as f32. LSE is cuDNN's softmax
// statistics [B, H, T] (f32), which only the backward call reads.
//
// Packed rows (several documents, kernels/attention.h's segment mask) are NOT expressed here: a row must hold
// one document (trailing padding is harmless: causal queries never see later keys, and padded positions
// carry no loss). The caller checks this on the host (model/decoder_xla.cpp). cuDNN's packed ("ragged") form
// takes per-row segment lengths and offsets; it is documented in docs/xla.md, not emitted yet.
//
// Shapes: q [B, T, H, D], k and v [B, T, Hkv, D] (f32 or bf16), dout [B, T, H, D]; D a multiple of 8 and at
// most 256 (cuDNN's flash attention on Hopper; 128 before Hopper).
#pragma once
#include <string>

#include "xla/hlo_builder.h"
#include "xla/ops_attention.h"

namespace olmosft::xla::ops {

AttentionForward attention_forward_cudnn(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                         const AttentionOptions& o);
// OUT and LSE: attention_forward_cudnn's on the same inputs; DOUT [B, T, H, D].
AttentionBackward attention_backward_cudnn(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                           const Value& out, const Value& lse, const Value& dout,
                                           const AttentionOptions& o);

// The backend_config text of either call, as XLA's CUDA backend parses it (exposed for the test).
std::string cudnn_fmha_config(int64_t B, int64_t H, int64_t T, const AttentionOptions& o, bool backward);

}  // namespace olmosft::xla::ops
