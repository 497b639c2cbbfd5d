// cuDNN's fused (flash) attention as XLA's CUDA backend runs it: the StableHLO custom calls
// `__cudnn$fmhaSoftmax` (forward) and `__cudnn$fmhaSoftmaxBackward`, with the operands, layouts and JSON
// backend_config that JAX's `jax.nn.dot_product_attention(..., implementation="cudnn")` lowers to for the
// `cuda` platform (recorded by tests/reference/jax_cudnn_attention.py; xla_cudnn_attention_test compares).
// Only XLA's CUDA plugin can compile these calls (the CPU plugin and libtpu have no handler for them).
//
// Semantics: causal softmax attention of each row over all of its keys (packed: of each document over its
// document's keys), optionally in a sliding window (query i sees key j iff j <= i and i - j < window), GQA
// (H a multiple of Hkv):
//   s_ij = scale q_i . k_j,  out_i = sum_j softmax_j(s_ij) v_j
// The operands are rounded to bf16 (cuDNN's flash attention takes bf16 or fp16) and the products summed in
// f32 inside cuDNN; OUT, DQ, DK and DV come back as bf16 and are returned as f32. LSE is cuDNN's softmax
// statistics [B, H, T] (packed: [B * M, H, T]; f32), which only the backward call reads.
//
// Rows of one document (then padding) need nothing more: trailing padding is harmless (causal queries never
// see later keys, and padded positions carry no loss). Packed rows (several documents, kernels/attention.h's
// segment mask) take cuDNN's packed ("ragged") form: pass a CudnnPacking, made from the batch's segment ids
// by cudnn_packed_rows on the host. Then mask PADDING_CAUSAL, max_seg_per_batch M, the segment lengths and
// offsets as four more operands, softmax statistics [B * M, H, T], as JAX lowers
// jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(q_seqlen, kv_seqlen, q_offsets,
// kv_offsets, mask_type=PADDING_CAUSAL) (tests/golden/xla/cudnn_fmha/packed_w*.json), and a query sees only
// the keys of its own document; padding tokens belong to no segment, and their outputs and gradients are set
// to 0 here (what cuDNN leaves there is not specified), which is exactly the blockwise attention's result.
//
// Shapes: q [B, T, H, D], k and v [B, T, Hkv, D] (f32 or bf16), dout [B, T, H, D]; D a multiple of 8 and at
// most 256 (cuDNN's flash attention on Hopper; 128 before Hopper).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "xla/hlo_builder.h"
#include "xla/ops_attention.h"

namespace olmosft::xla::ops {

// The packed form on the host: from SEG [B, T] (document ids, -1 padding), the documents of each row as
// cuDNN reads them, compacted over the batch as JAX's _fix_seqlen_offsets does: SEQLEN [B, M] the lengths of
// every row's documents in batch order, then 0; OFFSETS [B, M + 1] each document's first token counted from
// the batch's start, then B * T, in tokens (the graph multiplies them by a token's stride in q and in k, v).
// A document is a maximal run of one id >= 0; an id that appears in two runs of a row is refused (the
// blockwise attention would join them), as is a row with more than MAX_SEGMENTS documents or a batch whose
// element offsets (B * T * heads * D) do not fit cuDNN's int32 (checked when emitted).
struct CudnnPackedRows {
  int64_t max_segments = 0;  // M
  std::vector<int32_t> seqlen, offsets;
};
// The most documents any row of SEG holds; throws naming the row and token of a document split in two runs.
int64_t cudnn_documents_per_row(const int32_t* seg, int64_t B, int64_t T);
CudnnPackedRows cudnn_packed_rows(const int32_t* seg, int64_t B, int64_t T, int64_t max_segments);

// The packed form in the graph: SEQLEN s32 [B, M], OFFSETS s32 [B, M + 1] (cudnn_packed_rows' arrays, as
// arguments: M is part of the program's shape), SEG s32 [B, T] (padding tokens' results set to 0).
struct CudnnPacking {
  Value seqlen, offsets, seg;
};
// OFFSETS in elements of q [B, T, H, D] and of k, v [B, T, HKV, D]: offsets x H x D and offsets x HKV x D
// (the fill past the last document, B x T, too), the q_offsets and kv_offsets operands. Exposed for the test.
struct CudnnElementOffsets {
  Value q, kv;
};
CudnnElementOffsets cudnn_element_offsets(HloBuilder& b, const Value& offsets, int64_t H, int64_t Hkv,
                                          int64_t D);

// PACKED null: rows of one document, mask CAUSAL.
AttentionForward attention_forward_cudnn(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                         const AttentionOptions& o, const CudnnPacking* packed = nullptr);
// OUT and LSE: attention_forward_cudnn's on the same inputs (and PACKED); DOUT [B, T, H, D].
AttentionBackward attention_backward_cudnn(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                           const Value& out, const Value& lse, const Value& dout,
                                           const AttentionOptions& o, const CudnnPacking* packed = nullptr);

// The backend_config text of either call, as XLA's CUDA backend parses it (exposed for the test);
// MAX_SEGMENTS > 0: the packed form.
std::string cudnn_fmha_config(int64_t B, int64_t H, int64_t T, const AttentionOptions& o, bool backward,
                              int64_t max_segments = 0);

}  // namespace olmosft::xla::ops
