// Olmo 3's attention mixer unit (see unit_rope_attention.h).
#include "model/unit_rope_attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

namespace olmosft::model::unit {

RopeAttentionUnit RopeAttentionUnit::resolve(const ParamIndex& idx, const std::string& a, LayerType type) {
  RopeAttentionUnit u;
  resolve_attention(idx, a, &u.q, &u.k, &u.v, &u.o, &u.qnorm, &u.knorm);
  u.sliding = type == LayerType::SlidingAttention;
  return u;
}

int64_t RopeAttentionUnit::saved_floats_per_token(const ModelConfig& c) {
  const int64_t HD = c.num_attention_heads * c.head_dim, KD = c.num_key_value_heads * c.head_dim;
  return 2 * HD + 2 * KD + c.num_attention_heads + 2;
}

void RopeAttentionUnit::Saved::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const int64_t HD = c.num_attention_heads * c.head_dim, KD = c.num_key_value_heads * c.head_dim;
  // fp32 under saved_dtype bf16 too: the backward recomputes the probabilities from q, k and the fp32 lse
  p.add(&qraw, N * HD);
  p.add(&kraw, N * KD);
  p.add(&v, N * KD);
  p.add(&o, N * HD);
  p.add(&lse, N * c.num_attention_heads);
  p.add(&rq, N);
  p.add(&rk, N);
}

void RopeAttentionUnit::Scratch::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const int64_t HD = c.num_attention_heads * c.head_dim, KD = c.num_key_value_heads * c.head_dim;
  p.add(&q, N * HD);
  p.add(&k, N * KD);
  p.add(&dO, N * HD);
  p.add(&dq, N * HD);
  p.add(&dk, N * KD);
  p.add(&dv, N * KD);
}

void RopeAttentionUnit::forward(const Ctx<float>& ctx, const float* x, float* a, const Saved& s,
                                Scratch& w) const {
  const ModelConfig& cfg = ctx.c;
  const int64_t N = ctx.N, d = ctx.d, H = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads,
                D = cfg.head_dim, HD = H * D, KD = Hkv * D;
  const double eps = cfg.rms_norm_eps;
  linear_forward<float>(x, ctx.W(q), s.qraw, N, d, HD);
  linear_forward<float>(x, ctx.W(k), s.kraw, N, d, KD);
  linear_forward<float>(x, ctx.W(v), s.v, N, d, KD);
  rmsnorm_forward<float>(s.qraw, ctx.W(qnorm), w.q, s.rq, N, HD, eps);
  rmsnorm_forward<float>(s.kraw, ctx.W(knorm), w.k, s.rk, N, KD, eps);
  const float* cs = sliding ? w.cos_s : w.cos_f;
  const float* sn = sliding ? w.sin_s : w.sin_f;
  rope_forward<float>(w.q, cs, sn, N, H, D, HD);
  rope_forward<float>(w.k, cs, sn, N, Hkv, D, KD);
  const AttentionConfig ac = attention_config(cfg, ctx.b.B, ctx.b.T, sliding ? cfg.sliding_window : 0);
  attention_forward<float>(ac, w.q, w.k, s.v, ctx.seg, s.o, s.lse, w.attn_ws, w.attn_ws_bytes);
  linear_forward<float>(s.o, ctx.W(o), a, N, HD, d);
}

void RopeAttentionUnit::backward(const Ctx<float>& ctx, const float* x, const Saved& s, const float* da,
                                 float* dx, Scratch& w) const {
  const ModelConfig& cfg = ctx.c;
  const int64_t N = ctx.N, d = ctx.d, H = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads,
                D = cfg.head_dim, HD = H * D, KD = Hkv * D;
  const double eps = cfg.rms_norm_eps;
  linear_backward<float>(da, s.o, ctx.W(o), w.dO, ctx.G(o), N, HD, d);
  // Recompute the normed, rotated q and k.
  rmsnorm_forward<float>(s.qraw, ctx.W(qnorm), w.q, nullptr, N, HD, eps);
  rmsnorm_forward<float>(s.kraw, ctx.W(knorm), w.k, nullptr, N, KD, eps);
  const float* cs = sliding ? w.cos_s : w.cos_f;
  const float* sn = sliding ? w.sin_s : w.sin_f;
  rope_forward<float>(w.q, cs, sn, N, H, D, HD);
  rope_forward<float>(w.k, cs, sn, N, Hkv, D, KD);
  const AttentionConfig ac = attention_config(cfg, ctx.b.B, ctx.b.T, sliding ? cfg.sliding_window : 0);
  attention_backward<float>(ac, w.q, w.k, s.v, ctx.seg, s.o, s.lse, w.dO, w.dq, w.dk, w.dv, w.attn_ws,
                            w.attn_ws_bytes);
  rope_backward<float>(w.dq, cs, sn, N, H, D, HD);
  rope_backward<float>(w.dk, cs, sn, N, Hkv, D, KD);
  float* dqraw = w.dO;  // free after the attention backward
  float* dkraw = w.q;   // free after the attention backward (HD >= KD)
  rmsnorm_backward<float>(w.dq, s.qraw, ctx.W(qnorm), s.rq, dqraw, ctx.G(qnorm), N, HD, eps);
  rmsnorm_backward<float>(w.dk, s.kraw, ctx.W(knorm), s.rk, dkraw, ctx.G(knorm), N, KD, eps);
  linear_backward<float>(dqraw, x, ctx.W(q), dx, ctx.G(q), N, d, HD, true);
  linear_backward<float>(dkraw, x, ctx.W(k), dx, ctx.G(k), N, d, KD, true);
  linear_backward<float>(w.dv, x, ctx.W(v), dx, ctx.G(v), N, d, KD, true);
}

}  // namespace olmosft::model::unit
