// Softmax attention mixer unit: every attention layer of every family (Olmo 3's sliding / full attention
// with RoPE, docs/reference/architecture.md A.3, A.4; the hybrid's NoPE attention with per-head q/k norms,
// scalable softmax and an output gate, B.3):
//
//   q, k, v = x Wq^T, x Wk^T, x Wv^T
//   q, k = RMSNorm over each head (use_head_qk_norm; per-head gains) or over the whole H*D vector
//   q, k = RoPE at the per-document positions, of the layer's table (Olmo 3: YaRN on full_attention layers)
//   q *= ssmax_scale[h] * log(pos + 1)             (scalable softmax, when configured)
//   o = softmax attention within the document (GQA, scale D^-1/2; sliding window on sliding layers)
//   o *= sigmoid(x Wg^T)                           (elementwise gate, when configured);  a = o Wo^T
//
// Parameters (self_attn.*): q/k/v/o_proj, q_norm, k_norm, optional g_proj and ssmax_scale.
// Saves the raw q and k projections, v, o, the attention logsumexp, the q/k norms' rstd and, with the gate,
// its logits and the gated o. Recomputes the normed (rotated, scaled) q and k in the backward: an RMSNorm,
// a RoPE and a product, cheap next to the attention. Saved and Scratch are carved from the model's planned
// workspace (unit::Plan); the attention kernel's own workspace comes in Ctx::attn_ws.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "model/layers.h"
#include "model/unit.h"
#include "model/unit_emit.h"

namespace olmosft::model::unit {

struct AttentionUnit {
  int q = -1, k = -1, v = -1, o = -1, qnorm = -1, knorm = -1, gate = -1, ssmax_scale = -1;
  int64_t window = 0;  // 0 = full causal
  RopeKind rope = RopeKind::None;

  template <typename T>
  struct Saved {
    T *q, *k, *v, *o, *lse, *qrs, *krs, *zg, *og;         // zg, og: gate only
    void plan(Plan& p, const ModelConfig& c, int64_t N);  // saved_floats_per_token(c) * N values
  };
  // Shared by the attention layers: the normed q and k (and the SSMax-scaled q) of the forward and of the
  // backward's recomputation, the backward's gradients, and a float64 accumulator for the SSMax gains.
  template <typename T>
  struct Scratch {
    T *qn, *kn, *qs, *dog, *dO, *dz, *dq, *dqn, *dk, *dv;  // qs, dqn: SSMax only; dog, dz: gate only
    double* acc;
    void plan(Plan& p, const ModelConfig& c, int64_t N);  // per_token(c) * N values + acc
    static int64_t per_token(const ModelConfig& c);
  };

  // x [N, d] -> a [N, d] (overwritten).
  template <typename T>
  void forward(const Ctx<T>& ctx, const T* x, T* a, const Saved<T>& s, const Scratch<T>& w) const;
  // da [N, d] -> dx [N, d] ACCUMULATED; parameter gradients accumulated.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx,
                const Scratch<T>& w) const;

  // XLA (unit_emit.h): the same formulas as StableHLO. The graph keeps the raw q and k projections, their
  // rstd, the attention's inputs (normed, rotated, scaled q; normed, rotated k; v: [B, T, heads, D]), its
  // output and logsumexp, and with the gate its logits and the gated output.
  struct Emitted {
    std::optional<xla::Value> q, k, qrs, krs, qn, qin, kin, vin, out, lse, zg, og;
  };
  xla::Value emit_forward(Emit& e, const xla::Value& x, Emitted& s) const;
  xla::Value emit_backward(Emit& e, const xla::Value& x, const Emitted& s, const xla::Value& da) const;

  static constexpr const char* kName = "attention";
  static constexpr const char* kPrefix = hf::kSelfAttn;  // its tensors: model.layers.<l>.self_attn.*
  // Declares (or resolves, unit.h Params) the layer's tensors, in HF order; takes its window and RoPE table.
  void params(Params& p, const ModelConfig& c, const LayerSpec& spec);
  static int64_t saved_floats_per_token(const ModelConfig& c);
  // FLOPs (train/flops.cpp): weight elements of the GEMMs run once per token (q/k/v/o, the gate). The
  // score and value work per visible (query, key) pair is H * D multiply-adds each way (kernels/attention.h).
  static double gemm_weights_per_token(const ModelConfig& c);
  // Per-head delta-rule recurrences this mixer runs per layer (train/flops.cpp counts each per document
  // chunk as train::kda_document_flops), and its widest per-token projection (train/plan.cpp: bf16 operands).
  static int64_t delta_rule_heads(const ModelConfig&) { return 0; }
  static int64_t widest_projection(const ModelConfig& c) { return c.num_attention_heads * c.head_dim; }

 private:
  // The normed (rotated, SSMax-scaled) q and k into w.qn / w.kn (and w.qs); returns the q the attention
  // reads.
  template <typename T>
  const T* normed_qk(const Ctx<T>& ctx, const Saved<T>& s, const Scratch<T>& w, bool save_rstd) const;
};

}  // namespace olmosft::model::unit
