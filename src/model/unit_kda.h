// KDA mixer unit (the hybrid's linear_attention layers; docs/reference/architecture.md B.4, docs/hybrid.md):
//
//   q, k, v = x Wq^T, x Wk^T, x Wv^T -> causal short conv + SiLU within the document -> q, k: L2 norm
//   per head;  g = gate(f_proj_2(f_proj_1(x)); A_log, dt_bias);  beta = (2*)sigmoid(x Wbeta^T)
//   o = delta rule (chunked, or token by token) within the document
//   y = o_norm(o, gated by g_proj_2(g_proj_1(x)) + bias);  a = y Wo^T
//
// Parameters (self_attn.*): q/k/v_proj, f_proj_1/2, beta_proj, A_log, dt_bias, q/k/v_conv1d, g_proj_1,
// g_proj_2 (+ bias), o_norm, o_proj. Saves every intermediate above (conv inputs and outputs, normalised
// q/k, the low-rank gate inputs, gate, beta logits and beta, o, the output-gate pre-activation, y);
// recomputes nothing. Saved and Scratch are carved from the model's planned workspace (unit::Plan).
//
// On XLA (unit_emit.h, docs/xla.md) the same formulas as StableHLO; the delta rule there is the
// token-by-token recurrence (a while loop over t with a [B, H, Dk, Dv] state), its backward the reverse-time
// recurrence.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>

#include "model/layers.h"
#include "model/unit.h"
#include "model/unit_emit.h"

namespace olmosft::model::unit {

struct KdaUnit {
  int q = -1, k = -1, v = -1, o = -1, f1 = -1, f2 = -1, bproj = -1, A_log = -1, dt_bias = -1, qconv = -1,
      kconv = -1, vconv = -1, g1 = -1, g2 = -1, g2b = -1, onorm = -1;

  template <typename T>
  struct Saved {
    T *qin, *kin, *vin, *qc, *kc, *vc, *qn, *kn, *flow, *f, *g, *blog, *beta, *o, *glow, *zg, *y;
    T* vn;  // the chunked delta rule's pseudo-values, for its backward (kernels/kda.h)
    void plan(Plan& p, const ModelConfig& c, int64_t N);  // saved_floats_per_token(c) * N values
  };
  // The backward's gradients of the intermediates (shared by the KDA layers), and stand-ins for absent
  // parameter gradients (o_norm, A_log, dt_bias, conv weights).
  template <typename T>
  struct Scratch {
    T *dy, *dO, *dzg, *dglow, *dq, *dk, *dv, *dg, *dbeta, *dblog, *df, *dflow, *dc, *din;
    T *donorm, *dA, *ddt, *dconv;
    void plan(Plan& p, const ModelConfig& c, int64_t N);  // per_token(c) * N values + the stand-ins
    static int64_t per_token(const ModelConfig& c);
  };

  // XLA (unit_emit.h): the graph keeps the projections' outputs (conv inputs), the conv outputs (q and k
  // before their L2 norm), the normalised q and k, the gate's low-rank input and its raw decay f, the gate g,
  // the beta logits, the delta rule's output o, the output gate's low-rank input and pre-activation, and y.
  // The backward recomputes the delta rule's states from checkpoints every emit_checkpoint tokens (as
  // kda_recurrent_backward): ceil(T / emit_checkpoint) + emit_checkpoint states of [B, H, Dk, Dv] live.
  int64_t emit_checkpoint = 64;
  struct Emitted {
    std::optional<xla::Value> qin, kin, vin, qc, kc, vc, qn, kn, flow, f, g, blog, o, glow, zg, y;
  };
  xla::Value emit_forward(Emit& e, const xla::Value& x, Emitted& s) const;
  xla::Value emit_backward(Emit& e, const xla::Value& x, const Emitted& s, const xla::Value& da) const;

  static constexpr const char* kName = "KDA";
  static constexpr const char* kPrefix = hf::kSelfAttn;  // its tensors: model.layers.<l>.self_attn.*
  // Declares (or resolves, unit.h Params) the layer's tensors, in HF order.
  void params(Params& p, const ModelConfig& c, const LayerSpec& spec);
  static int64_t saved_floats_per_token(const ModelConfig& c);
  // FLOPs (train/flops.cpp): weight elements of the per-token GEMMs (q/k/v, f_proj_1/2, beta, g_proj_1/2,
  // o); the delta rule itself is counted per document chunk by train::kda_document_flops.
  static double gemm_weights_per_token(const ModelConfig& c);
  // Per-head delta-rule recurrences this mixer runs per layer (train/flops.cpp counts each per document
  // chunk as train::kda_document_flops), and its widest per-token projection (train/plan.cpp: bf16 operands).
  static int64_t delta_rule_heads(const ModelConfig& c) { return c.linear_num_key_heads; }
  static int64_t widest_projection(const ModelConfig& c) {
    return c.linear_num_key_heads * std::max(c.linear_key_head_dim, c.linear_value_head_dim);
  }

  // x [N, d] -> a [N, d] (overwritten); the forward needs no scratch (the mixers' common signature).
  template <typename T>
  void forward(const Ctx<T>& ctx, const T* x, T* a, const Saved<T>& s, const Scratch<T>& w) const;
  // da [N, d] -> dx [N, d] ACCUMULATED; parameter gradients accumulated.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx,
                const Scratch<T>& w) const;
};

}  // namespace olmosft::model::unit
