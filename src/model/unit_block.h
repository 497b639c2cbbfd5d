// The hybrid's peri-LN block (docs/reference/architecture.md B.2): a mixer unit (KDA or softmax attention)
// and an FFN unit (dense SwiGLU MLP or latent MoE), each wrapped in a pre-norm and a post-norm:
//
//   h_mid = h + RMSNorm_post_attn(mixer(RMSNorm_pre_attn(h)))
//   h_out = h_mid + RMSNorm_post_ffn(ffn(RMSNorm_pre_ffn(h_mid)))
//
// Parameters: model.layers.<l>.{pre,post}_{attention,feedforward}_layernorm plus the units'. Saves the
// block input, the two normed inputs, the mixer and FFN outputs, h_mid and the four rstd (6 d + 4 floats
// per token) plus the units' Saved. Saved and Scratch are carved from the model's planned workspace
// (unit::Plan); one Scratch serves every layer. Recomputation (model.remat, memory_policy.h): with
// Ctx::recompute_mixer the backward first re-runs the mixer's forward from x1 into its Saved (remat attn);
// remat full re-runs forward() from the kept block input (the model's runner does that).
#pragma once
#include <cstdint>

#include "model/unit.h"
#include "model/unit_attention.h"
#include "model/unit_ffn.h"
#include "model/unit_kda.h"
#include "model/unit_rope_attention.h"

namespace olmosft::model::unit {

struct PeriLnBlock {
  int64_t layer = 0;
  bool kda = true;     // mixer: KdaUnit (linear_attention) or SoftmaxAttentionUnit
  bool dense = false;  // FFN: SwiGluMlpUnit or MoeUnit
  int pre_attn = -1, post_attn = -1, pre_ffn = -1, post_ffn = -1;
  KdaUnit kda_unit;
  SoftmaxAttentionUnit attn_unit;
  SwiGluMlpUnit mlp_unit;
  MoeUnit moe_unit;

  template <typename T>
  struct Saved {
    T *h_in, *x1, *rs_pre_attn, *a, *rs_post_attn, *h_mid, *x2, *rs_pre_ffn, *f, *rs_post_ffn;
    KdaUnit::Saved<T> kda;                // KDA layers
    SoftmaxAttentionUnit::Saved<T> attn;  // attention layers
    SwiGluMlpUnit::Saved<T> mlp;          // dense layers
    MoeUnit::Saved<T> moe;                // MoE layers (vectors sized by moe.cpp)
    // Plans layer `layer`'s buffers: saved_floats_per_token(c, layer) * N values less the MoE cache;
    // without h_in when !input (recomputation points it at the kept block input) and without the mixer's
    // Saved when !mixer (remat attn shares one across the layers).
    void plan(Plan& p, const ModelConfig& c, int64_t layer, int64_t N, bool input = true, bool mixer = true);
    size_t moe_bytes() const { return moe.bytes(); }
  };
  // Shared by the layers: the block's temporaries [N, d] and the mixers' backward scratch.
  template <typename T>
  struct Scratch {
    T *t, *dA, *dX;
    KdaUnit::Scratch<T> kda;
    SoftmaxAttentionUnit::Scratch<T> attn;
    void plan(Plan& p, const ModelConfig& c, int64_t N);  // the mixers' scratch for the kinds c has
    static int64_t per_token(const ModelConfig& c);       // what plan requests per token
  };

  static PeriLnBlock resolve(const ParamIndex& idx, const ModelConfig& c, int64_t layer);
  static int64_t saved_floats_per_token(const ModelConfig& c, int64_t layer);

  // h [N, d] in place; the MoE layer's statistics and weighted aux losses are added to lp.
  template <typename T>
  void forward(const Ctx<T>& ctx, T* h, Saved<T>& s, const Scratch<T>& w, LossParts& lp) const;
  // dh [N, d] in place: gradient w.r.t. the block output in, w.r.t. the block input out.
  template <typename T>
  void backward(const Ctx<T>& ctx, T* dh, const Saved<T>& s, const Scratch<T>& w) const;
};

// Olmo 3's post-norm block (docs/reference/architecture.md A.3), fp32, on the planned workspace:
//
//   h_mid = x + RMSNorm_post_attn(RopeAttention(x));  y = h_mid + RMSNorm_post_ffn(SwiGLU-MLP(h_mid))
//
// Parameters: model.layers.<l>.post_attention_layernorm, post_feedforward_layernorm plus the units'.
// Saves the attention output a, h_mid, the MLP output m and the two rstd (3 d + 2 floats per token) plus
// the units' Saved (the block input is the model's residual stream); recomputes what its units do.
struct PostNormBlock {
  int post_attn = -1, post_ffn = -1;
  RopeAttentionUnit attn;
  RecomputedSwiGluMlpUnit mlp;

  struct Saved {
    RopeAttentionUnit::Saved attn;
    RecomputedSwiGluMlpUnit::Saved mlp;
    float *a, *ra, *hmid, *m, *rm;
    // Without the attention's Saved when !attn (remat attn shares one across the layers).
    void plan(Plan& p, const ModelConfig& c, int64_t N, bool attn = true);
  };
  struct Scratch {
    RopeAttentionUnit::Scratch attn;
    RecomputedSwiGluMlpUnit::Scratch mlp;
    float* dtmp;
    void plan(Plan& p, const ModelConfig& c, int64_t N);
  };

  static PostNormBlock resolve(const ParamIndex& idx, const ModelConfig& c, int64_t layer);
  static int64_t saved_floats_per_token(const ModelConfig& c);

  // x [N, d] -> y [N, d].
  void forward(const Ctx<float>& ctx, const float* x, float* y, Saved& s, Scratch& w) const;
  // dh [N, d] in place: dL/dy in, dL/dx out.
  void backward(const Ctx<float>& ctx, const float* x, const Saved& s, float* dh, Scratch& w) const;
};

}  // namespace olmosft::model::unit
