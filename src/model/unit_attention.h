// Softmax attention mixer unit of the hybrid (full_attention / sliding_attention layers of olmo3moe;
// docs/reference/architecture.md B.3). NoPE (no RoPE):
//
//   q, k, v = x Wq^T, x Wk^T, x Wv^T;  q, k = RMSNorm per head (use_head_qk_norm) or over the whole vector
//   q *= ssmax_scale[h] * log(pos + 1)          (scalable softmax, when configured)
//   o = softmax attention within the document (GQA; sliding window on sliding layers)
//   o *= sigmoid(x Wg^T)                        (elementwise gate, when configured);  a = o Wo^T
//
// Parameters (self_attn.*): q/k/v/o_proj, q_norm, k_norm, optional g_proj and ssmax_scale.
// Saves q, k, v, the normalised q/k and their rstd, the SSMax-scaled q, o and its logsumexp, the gate
// logits and the gated o; recomputes nothing. Saved and Scratch are carved from the model's planned
// workspace (unit::Plan); the attention kernel's own workspace is allocated per call. (Olmo 3's RoPE
// attention is a different unit: olmo3.cpp.)
#pragma once
#include <cstdint>
#include <string>

#include "model/unit.h"

namespace olmosft::model::unit {

struct SoftmaxAttentionUnit {
  int q = -1, k = -1, v = -1, o = -1, qnorm = -1, knorm = -1, gate = -1, ssmax_scale = -1;
  int64_t window = 0;  // 0 = full causal

  template <typename T>
  struct Saved {
    T *q, *k, *v, *qn, *kn, *qrs, *krs, *qs, *o, *lse, *zg, *og;  // qs: SSMax only; zg, og: gate only
    void plan(Plan& p, const ModelConfig& c, int64_t N);          // saved_floats_per_token(c) * N values
  };
  // The backward's gradients (shared by the attention layers) and a float64 accumulator for the norm and
  // SSMax gains.
  template <typename T>
  struct Scratch {
    T *dog, *dO, *dz, *dqs, *dqn, *dq, *dkn, *dv, *dk;
    double* acc;
    void plan(Plan& p, const ModelConfig& c, int64_t N);  // per_token(c) * N values + acc
    static int64_t per_token(const ModelConfig& c);
  };

  // The mixer interface (as KdaUnit): forward x [N, d] -> a [N, d]; backward da -> dx, both overwritten;
  // the backward accumulates the parameter gradients.
  template <typename T>
  void forward(const Ctx<T>& ctx, const T* x, T* a, const Saved<T>& s) const;
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx,
                const Scratch<T>& w) const;

  // prefix = "model.layers.<l>.self_attn."
  static SoftmaxAttentionUnit resolve(const ParamIndex& idx, const std::string& prefix, const ModelConfig& c,
                                      LayerType type);
  static int64_t saved_floats_per_token(const ModelConfig& c);
};

}  // namespace olmosft::model::unit
