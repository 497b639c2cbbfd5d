// The delta rule and its neighbours as StableHLO, shared by the KDA and Gated DeltaNet units' emit_forward /
// emit_backward (unit_emit.h, docs/xla.md): document masks, the causal depthwise conv + SiLU within
// documents, the per-head L2 norm, the decay gate, the gated output RMSNorm (sigmoid or SiLU gate), and the
// token-by-token delta rule with its reverse-time backward (states recomputed from checkpoints). Each mirrors
// its CPU kernel in kernels/kda.h (same formula, same document handling).
#pragma once
#include <cstdint>
#include <vector>

#include "xla/hlo_builder.h"
#include "xla/mesh.h"

namespace olmosft::model::unit::delta_emit {

using xla::HloBuilder;
using xla::Value;

// A mixer's token arrays [N, W] are in the row tiles' order (unit_emit.h Emit: [B * S, T / S] tiles, S = a
// row's pieces over the mesh's expert x context, in the mesh's blocked order). The convs, the document masks
// and the delta rule need whole rows: the same arrays seen as [B, T, W] (a reshape and a transpose, which
// moves no data under the partitioner: rows stay split over data x fsdp, tokens over expert x context).
struct Rows {
  int64_t R = 1, S = 1, Bl = 0, Tl = 0;  // batch shards, a row's pieces, rows / tokens per tile
  const xla::Mesh* mesh = nullptr;       // null: one device
  int64_t B() const { return R * Bl; }
  int64_t T() const { return S * Tl; }
};
// From the mixer's tiles: BT rows of TT tokens (Emit::B, Emit::T) on MESH (may be null).
Rows rows_of(const xla::Mesh* mesh, int64_t BT, int64_t TT);
Value to_rows(HloBuilder& b, const Rows& r, const Value& x);     // [N, W] -> [B, T, W]
Value from_rows(HloBuilder& b, const Rows& r, const Value& y);   // [B, T, W] -> [N, W]
Value seg_rows(HloBuilder& b, const Rows& r, const Value& seg);  // s32 [B * S, T / S] -> [B, T]
// X laid out as the LOGICAL axes (one per dimension) on the mesh; unchanged on one device.
Value lay_out(HloBuilder& b, const Rows& r, const Value& x, const std::vector<xla::Logical>& logical);
// A token array X [N, H*D] as the delta rule's time-major [T, B, H, D], laid out with the heads split
// (DeltaInputs below): its inputs, and the output gradient its backwards read.
Value time_major(HloBuilder& b, const Rows& r, const Value& x, int64_t H, int64_t D);

// f32 constant of DIMS; X broadcast to DIMS with its dimensions at BDIMS.
Value full(HloBuilder& b, const std::vector<int64_t>& dims, double v);
Value bc(HloBuilder& b, const Value& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& bdims);

// The documents of a [B, T] batch as f32 0/1 masks [B, T] (valid, a document's first token, and per conv
// shift s whether token t - s is in t's document).
struct DocMasks {
  Value valid, start;
  std::vector<Value> conv;
};
DocMasks doc_masks(HloBuilder& b, const Value& seg, int64_t K);

// Causal depthwise conv + SiLU within documents, IN [N, C], W [C, 1, K] (kernels/kda.h short_conv_silu), M
// the masks of the whole rows R.
Value conv_forward(HloBuilder& b, const Value& in, const Value& w, const DocMasks& m, const Rows& r);
struct ConvBackward {
  Value dx, dw;
};
ConvBackward conv_backward(HloBuilder& b, const Value& in, const Value& w, const DocMasks& m, const Value& dy,
                           const Rows& r);

// L2 norm of each head, X [N, H*D] (eps 1e-6 inside the root).
Value l2norm_forward(HloBuilder& b, const Value& x, int64_t H, int64_t D);
Value l2norm_backward(HloBuilder& b, const Value& x, const Value& dy, int64_t H, int64_t D);

// torch softplus (threshold 20); the gate g = -exp(A_log[h]) softplus(f + dt_bias), F [N, H*D] -> [N, H, D].
Value softplus(HloBuilder& b, const Value& x);
Value gate_forward(HloBuilder& b, const Value& f, const Value& A_log, const Value& dt_bias, int64_t H,
                   int64_t D);

// The gated output RMSNorm, O, Z [N, H, D], W [D]: y = o rsqrt(mean(o^2) + eps) w act(z), act = sigmoid
// (KDA) or silu (GDN).
Value out_norm_forward(HloBuilder& b, const Value& o, const Value& z, const Value& w, double eps, bool silu);
struct OutNormBackward {
  Value dout, dz, dw;
};
OutNormBackward out_norm_backward(HloBuilder& b, const Value& o, const Value& z, const Value& w,
                                  const Value& dy, double eps, bool silu);

// The delta rule's inputs, time-major ([T, B, H, ...]): q scaled and zero on padding, the decay exp(g) (0
// at a document's first token, 1 on padding), beta zero on padding. G [N, H*Dk].
// For the chunked form also the log decay lg (g on a document's inner tokens, 0 at its first token and on
// padding: the chunks mask documents instead) and the documents' first tokens start [T, B] (f32 0/1).
// On a mesh they are laid out with the heads split over the row's pieces (Logical::kHeads) and each row
// whole: the partitioner's all-to-all from tokens to heads happens here, once, so the loops over time have
// no collective inside (xla/hlo_loops.h); H must divide by expert x context.
struct DeltaInputs {
  Value q, k, v, a, beta, lg, start;
  int64_t B, T, H, Dk, Dv;
  Rows rows;
};
DeltaInputs delta_inputs(HloBuilder& b, const DocMasks& m, const Value& qn, const Value& kn, const Value& vc,
                         const Value& g, const Value& beta, const Rows& r, int64_t H, int64_t Dk, int64_t Dv,
                         double scale);
// o [N, H*Dv], token by token (a while loop over t carrying the state [B, H, Dk, Dv]).
Value delta_forward(HloBuilder& b, const DeltaInputs& in);
// The reverse-time recurrence with the states recomputed from checkpoints every CKPT tokens.
struct DeltaGrads {
  Value dq, dk, dv, dg, dbeta;  // [N, H*Dk], [N, H*Dk], [N, H*Dv], [N, H*Dk], [N, H]
};
DeltaGrads delta_backward(HloBuilder& b, const DeltaInputs& in0, const DocMasks& m, const Value& dO,
                          double scale, int64_t ckpt);

// The chunked (WY / UT) delta rule (docs/kda.md "Chunked algorithm"; delta_rule_chunk_emit.cpp): chunks of
// CHUNK tokens from each row's first token (a row's tokens padded to whole chunks with no-op tokens), the
// documents inside a chunk kept apart by masks (a document may start mid-chunk, unlike the CPU kernel, which
// splits chunks at documents: the same sums in another order). The WY factors of every chunk are computed
// at once outside the loop (one batched triangular solve); a while loop over chunks, named
// xla::kDeltaRuleLoop, carries only the f32 state [B, H, Dk, Dv]. Same results as delta_forward.
Value delta_chunk_forward(HloBuilder& b, const DeltaInputs& in, int64_t chunk);
// Its backward: the factors again, a loop keeping the state entering each chunk (one state per chunk) and
// the pseudo-values, then a reverse loop over the chunks with the pairwise terms of one chunk at a time.
// Same results as delta_backward.
DeltaGrads delta_chunk_backward(HloBuilder& b, const DeltaInputs& in, const DocMasks& m, const Value& dO,
                                double scale, int64_t chunk);

// The form Emit::delta_chunk picks: chunks of CHUNK tokens, or (0) the token-by-token recurrence, whose
// backward recomputes its states from checkpoints every CKPT tokens.
Value delta_rule_forward(HloBuilder& b, const DeltaInputs& in, int64_t chunk);
DeltaGrads delta_rule_backward(HloBuilder& b, const DeltaInputs& in, const DocMasks& m, const Value& dO,
                               double scale, int64_t chunk, int64_t ckpt);

// Helpers the two forms share (delta_rule_emit.cpp): X [T, ...] at time I (an s32 scalar) without the time
// dimension; X with X[I] = V; X extended to TP tokens with the value V; D with D[I] = V.
Value at_time(HloBuilder& b, const Value& x, const Value& i);
Value put_time(HloBuilder& b, const Value& x, const Value& v, const Value& i);
Value pad_time(HloBuilder& b, const Value& x, int64_t tp, double v);
std::vector<int64_t> with_dim(std::vector<int64_t> d, size_t i, int64_t v);

}  // namespace olmosft::model::unit::delta_emit
