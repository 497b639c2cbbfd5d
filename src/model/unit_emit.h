// What the layer units read when they EMIT themselves as StableHLO (the XLA backend, docs/xla.md) instead of
// executing on the CPU kernels: the same units, the same formulas, written with the layer ops of src/xla
// (ops_*.h) into one graph. Each unit that the XLA backend runs has, beside forward / backward,
//   emit_forward(Emit&, x...)  -> its output and an `Emitted` struct of the graph values its backward reads
//                                  (the graph form of Saved: XLA decides what to keep and what to fuse);
//   emit_backward(Emit&, x, Emitted, dy) -> the gradient w.r.t. its input. The CPU contract "accumulate into
//                                  dx" becomes "return dx's term": the caller adds it (graph values are
//                                  immutable); parameter gradients are accumulated with Emit::grad.
// All values are f32 (bf16 operands in the GEMMs when Emit::operands says so).
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/memory_policy.h"
#include "model/model.h"
#include "xla/hlo_builder.h"
#include "xla/mesh.h"
#include "xla/ops_attention_cudnn.h"
#include "xla/ops_dense.h"

namespace olmosft::model::unit {

struct Emit {
  Emit(xla::HloBuilder& b_, const ModelConfig& c_, const LossConfig& loss_, std::vector<xla::Value> w_,
       int64_t B_, int64_t T_)
      : b(b_), c(c_), loss(loss_), w(std::move(w_)), B(B_), T(T_), N(B_ * T_), d(c_.hidden_size) {}
  xla::HloBuilder& b;
  const ModelConfig& c;
  const LossConfig& loss;
  std::vector<xla::Value> w;                 // the program's parameter values (f32), one per `arg` entry
  std::vector<std::optional<xla::Value>> g;  // gradient sums per parameter value (empty: forward only)
  // Registry index -> its value in w / g (model/xla_params.h: a MoE layer's routed experts share one stacked
  // value per projection, [E, ...]; the expert units read W(eg[0]) as that stack). Empty: one for one.
  std::vector<int> arg;
  // N = B * T tokens, d = hidden size. B and T lay the token array out as rows: the batch's [B, T], or over
  // a mesh that splits rows (context parallelism) its row tiles [B * C, T / C] in the mesh's blocked order
  // (xla/mesh.h): a mixer reshapes [N, ...] to [B, T, ...] and hands `mesh` to the ops that see whole rows.
  int64_t B = 0, T = 0, N = 0, d = 0;
  const xla::Mesh* mesh = nullptr;              // the program's device mesh (null: one device)
  std::optional<xla::Value> tokens;             // s32 [N]
  std::optional<xla::Value> seg;                // s32 [B, T] document id, -1 = padding (rows as above)
  std::optional<xla::Value> logpos;             // f32 [N] log(position + 1) (scalable softmax only)
  std::optional<xla::ops::RopeTables> rope[3];  // per RopeKind: [N, head_dim / 2]
  std::optional<xla::Value> aux_scale;          // f32 scalar: the MoE auxiliary losses' gradient factor
  // model.remat on XLA: attn makes Block::emit_backward re-emit the mixer's forward from its input before
  // the mixer's backward; full makes the decoder re-emit each block's forward from the block's input (the
  // inputs fenced by an optimization_barrier with the incoming gradient, as jax.checkpoint does, so XLA
  // neither merges the recomputation back into the forward nor runs it before the gradient arrives).
  Remat remat = Remat::None;
  xla::ops::Operands operands = xla::ops::Operands::kF32;
  int64_t attention_block = 64;  // keys / queries per block of the blockwise attention
  // KDA / Gated DeltaNet: tokens per chunk of the chunked delta rule (delta_emit::delta_chunk_forward); 0:
  // the token-by-token recurrence (delta_forward), the exact reference.
  int64_t delta_chunk = 64;
  bool attention_cudnn = false;  // cuDNN's fused attention (xla/ops_attention_cudnn.h) instead of blockwise
  std::optional<xla::ops::CudnnPacking>
      cudnn_packed;  // its packed form's arguments (rows of several documents)
  // Per MoE layer in layer order, appended by MoeUnit::emit_forward: f32 [4] = load-balance loss, router
  // z-loss (both unweighted), required_buffer_factor, dropped (token, slot) assignments (moe::MoeStats).
  std::vector<xla::Value> moe_stats;

  size_t at(int idx) const { return arg.empty() ? size_t(idx) : size_t(arg[size_t(idx)]); }
  const xla::Value& W(int idx) const { return w[at(idx)]; }
  bool backward() const { return !g.empty(); }
  // Adds TERM to parameter IDX's gradient (no-op when forward only or idx < 0); of a stack, the stack's.
  void grad(int idx, const xla::Value& term) {
    if (g.empty() || idx < 0) return;
    std::optional<xla::Value>& s = g[at(idx)];
    s = s ? b.add(*s, term) : term;
  }
};

}  // namespace olmosft::model::unit
