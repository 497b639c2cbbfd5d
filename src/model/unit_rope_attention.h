// Olmo 3's attention mixer unit (docs/reference/architecture.md A.3, A.4), fp32:
//
//   q = RMSNorm_q(x Wq^T) over the whole H*D vector, k likewise over Hkv*D, v = x Wv^T (kernels/rmsnorm)
//   q, k = RoPE of the layer's type at the per-document positions (YaRN on full_attention layers)
//   o = softmax attention within the document (GQA; sliding window on sliding layers);  a = o Wo^T
//
// Parameters (self_attn.*): q_proj, k_proj, v_proj, o_proj, q_norm, k_norm.
// Saves the raw q and k projections, v, o, the attention logsumexp and the q/k norms' rstd
// (2 H*D + 2 Hkv*D + H + 2 floats per token). Recomputes the normed, rotated q and k in the backward.
// Scratch (shared by all layers): q, k in the forward; dO, dq, dk, dv in the backward.
#pragma once
#include <cstdint>
#include <string>

#include "model/unit.h"

namespace olmosft::model::unit {

struct RopeAttentionUnit {
  int q = -1, k = -1, v = -1, o = -1, qnorm = -1, knorm = -1;
  bool sliding = false;

  struct Saved {
    float *qraw, *kraw, *v, *o, *lse, *rq, *rk;
    void plan(Plan& p, const ModelConfig& c, int64_t N);
  };
  struct Scratch {
    float *q, *k, *dO, *dq, *dk, *dv;
    void plan(Plan& p, const ModelConfig& c, int64_t N);
    const float *cos_s = nullptr, *sin_s = nullptr, *cos_f = nullptr, *sin_f = nullptr;  // RoPE tables
    void* attn_ws = nullptr;                                                             // attention kernel
    size_t attn_ws_bytes = 0;
  };

  // prefix = "model.layers.<l>.self_attn."
  static RopeAttentionUnit resolve(const ParamIndex& idx, const std::string& prefix, LayerType type);
  static int64_t saved_floats_per_token(const ModelConfig& c);

  // x [N, d] -> a [N, d] (overwritten).
  void forward(const Ctx<float>& ctx, const float* x, float* a, const Saved& s, Scratch& w) const;
  // da [N, d] -> dx [N, d] (ACCUMULATED); parameter gradients accumulated.
  void backward(const Ctx<float>& ctx, const float* x, const Saved& s, const float* da, float* dx,
                Scratch& w) const;
};

}  // namespace olmosft::model::unit
