// Gated DeltaNet mixer unit (Olmo Hybrid's linear_attention layers; docs/olmo_hybrid.md, HF
// OlmoHybridGatedDeltaNet):
//
//   q, k, v = x Wq^T, x Wk^T, x Wv^T -> one depthwise causal conv + SiLU over [q | k | v] within the document
//   -> q, k: L2 norm per head;  g[t,h] = -exp(A_log[h]) softplus(x Wa^T + dt_bias[h]) (one decay per head)
//   beta = (2*)sigmoid(x Wb^T);  o = delta rule within the document (chunked, or token by token)
//   y = RMSNorm(o) * w_o * silu(x Wg^T) per (token, head), eps 1e-5;  a = y Wo^T
//
// GDN is KDA with its per-channel decay tied to one scalar per head: the delta rule runs in KDA's kernels
// (kernels/kda.h) with g broadcast over the key dimension, and its key-dimension gradients summed back.
// Parameters (linear_attn.*): q/k/v/a/b/g/o_proj, A_log [H], dt_bias [H], conv1d [2KD + VD, 1, K] (rows q,
// k, v), o_norm [Dv]. Saves the projections, the conv outputs, the normalised q/k, the decay input and the
// decay, the beta logits and beta, o, the gate pre-activation and y; recomputes nothing. Value heads equal
// key heads (GVA is refused by the config).
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "model/layers.h"
#include "model/unit.h"
#include "model/unit_emit.h"

namespace olmosft::model::unit {

struct GdnUnit {
  int q = -1, k = -1, v = -1, aproj = -1, bproj = -1, gproj = -1, o = -1, A_log = -1, dt_bias = -1, conv = -1,
      onorm = -1;

  template <typename T>
  struct Saved {
    T *qin, *kin, *vin, *qc, *kc, *vc, *qn, *kn, *araw, *gh, *blog, *beta, *out, *z, *y;
    T* vn;  // the chunked delta rule's pseudo-values, for its backward (kernels/kda.h)
    void plan(Plan& p, const ModelConfig& c, int64_t N);  // saved_floats_per_token(c) * N values
  };
  // The per-head decay broadcast over the key dimension (the delta-rule kernels' g), the backward's
  // gradients of the intermediates (shared by the GDN layers), and stand-ins for absent parameter gradients.
  template <typename T>
  struct Scratch {
    T *gk, *dy, *dO, *dz, *dv, *dq, *dk, *dgk, *dg, *da, *dbeta, *dblog, *dc, *din;
    T *qe = nullptr, *ke = nullptr;  // GVA: q, k repeated per value head
    T *donorm, *dA, *ddt, *dconv;
    void plan(Plan& p, const ModelConfig& c, int64_t N);  // per_token(c) * N values + the stand-ins
    static int64_t per_token(const ModelConfig& c);
  };

  // XLA (unit_emit.h): the graph keeps the projections, the conv outputs, the normalised q/k, the decay input
  // and the per-head decay, the beta logits, o, the gate pre-activation and y; the delta rule's backward
  // recomputes its states from checkpoints every emit_checkpoint tokens.
  int64_t emit_checkpoint = 64;
  struct Emitted {
    std::optional<xla::Value> qin, kin, vin, qc, kc, vc, qn, kn, araw, gh, blog, o, z, y;
  };
  xla::Value emit_forward(Emit& e, const xla::Value& x, Emitted& s) const;
  xla::Value emit_backward(Emit& e, const xla::Value& x, const Emitted& s, const xla::Value& da) const;

  static constexpr const char* kName = "Gated DeltaNet";
  static constexpr const char* kPrefix = hf::kLinearAttn;  // its tensors: model.layers.<l>.linear_attn.*
  // Declares (or resolves, unit.h Params) the layer's tensors, in HF order.
  void params(Params& p, const ModelConfig& c, const LayerSpec& spec);
  static int64_t saved_floats_per_token(const ModelConfig& c);
  // FLOPs (train/flops.cpp): weight elements of the per-token GEMMs (q/k/v, a, b, g, o); the delta rule is
  // counted per document chunk as KDA's (train::kda_document_flops).
  static double gemm_weights_per_token(const ModelConfig& c);
  // Per-head delta-rule recurrences this mixer runs per layer (train/flops.cpp counts each per document
  // chunk as train::kda_document_flops), and its widest per-token projection (train/plan.cpp: bf16 operands).
  static int64_t delta_rule_heads(const ModelConfig& c) { return c.linear_num_value_heads; }
  static int64_t widest_projection(const ModelConfig& c) {
    return std::max(c.linear_num_key_heads * c.linear_key_head_dim,
                    c.linear_num_value_heads * c.linear_value_head_dim);
  }

  // x [N, d] -> a [N, d] (overwritten); the forward uses the scratch's gk.
  template <typename T>
  void forward(const Ctx<T>& ctx, const T* x, T* out, const Saved<T>& s, const Scratch<T>& w) const;
  // da [N, d] -> dx [N, d] ACCUMULATED; parameter gradients accumulated.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* dout, T* dx,
                const Scratch<T>& w) const;
};

}  // namespace olmosft::model::unit
