// The hybrid's peri-LN block (see unit_block.h).
#include "model/unit_block.h"

#include "core/threads.h"
#include "kernels/rmsnorm.h"
#include "model/params.h"

namespace olmosft::model::unit {

PeriLnBlock PeriLnBlock::resolve(const ParamIndex& idx, const ModelConfig& c, int64_t l) {
  PeriLnBlock u;
  const std::string p = hf::layer(l);
  u.layer = l;
  u.kda = c.layer_types[static_cast<size_t>(l)] == LayerType::LinearAttention;
  u.dense = c.is_dense_layer(l);
  u.pre_attn = idx.get(p + hf::kPreAttnNorm);
  u.post_attn = idx.get(p + hf::kPostAttnNorm);
  u.pre_ffn = idx.get(p + hf::kPreFfnNorm);
  u.post_ffn = idx.get(p + hf::kPostFfnNorm);
  if (u.kda)
    u.kda_unit = KdaUnit::resolve(idx, p + hf::kSelfAttn);
  else
    u.attn_unit =
        SoftmaxAttentionUnit::resolve(idx, p + hf::kSelfAttn, c, c.layer_types[static_cast<size_t>(l)]);
  if (u.dense)
    u.mlp_unit = SwiGluMlpUnit::resolve(idx, p + hf::kMlp);
  else
    u.moe_unit = MoeUnit::resolve(idx, p + hf::kMlp, c);
  return u;
}

int64_t PeriLnBlock::saved_floats_per_token(const ModelConfig& c, int64_t l) {
  const bool kda = c.layer_types[static_cast<size_t>(l)] == LayerType::LinearAttention;
  return 6 * c.hidden_size + 4 +
         (kda ? KdaUnit::saved_floats_per_token(c) : SoftmaxAttentionUnit::saved_floats_per_token(c)) +
         (c.is_dense_layer(l) ? SwiGluMlpUnit::saved_floats_per_token(c)
                              : MoeUnit::saved_floats_per_token(c));
}

template <typename T>
size_t PeriLnBlock::Saved<T>::bytes() const {
  size_t n = 0;
  for (const Vec<T>* v :
       {&h_in, &x1, &rs_pre_attn, &a, &rs_post_attn, &h_mid, &x2, &rs_pre_ffn, &f, &rs_post_ffn})
    n += vec_bytes(*v);
  return n + kda.bytes() + attn.bytes() + mlp.bytes() + moe.bytes();
}

template <typename T>
void PeriLnBlock::forward(const Ctx<T>& ctx, Vec<T>& h, Saved<T>& s, LossParts& lp) const {
  const int64_t N = ctx.N, d = ctx.d;
  const double eps = ctx.c.rms_norm_eps;
  s.h_in = h;
  s.x1.resize(h.size());
  s.rs_pre_attn.resize(static_cast<size_t>(N));
  rmsnorm_forward(h.data(), ctx.W(pre_attn), s.x1.data(), s.rs_pre_attn.data(), N, d, eps);
  s.a.resize(static_cast<size_t>(N * d));
  if (kda)
    kda_unit.forward(ctx, s.x1.data(), s.a.data(), s.kda);
  else
    attn_unit.forward(ctx, s.x1.data(), s.a.data(), s.attn);
  Vec<T> t(h.size());
  s.rs_post_attn.resize(static_cast<size_t>(N));
  rmsnorm_forward(s.a.data(), ctx.W(post_attn), t.data(), s.rs_post_attn.data(), N, d, eps);
  add_into(h.data(), t.data(), N * d);
  s.h_mid = h;
  s.x2.resize(h.size());
  s.rs_pre_ffn.resize(static_cast<size_t>(N));
  rmsnorm_forward(h.data(), ctx.W(pre_ffn), s.x2.data(), s.rs_pre_ffn.data(), N, d, eps);
  s.f.resize(h.size());
  if (dense) {
    mlp_unit.forward(ctx, s.x2.data(), s.f.data(), s.mlp);
  } else {
    const moe::MoeStats st = moe_unit.forward(ctx, s.x2.data(), s.f.data(), s.moe);
    MoeLayerStats ms;
    ms.layer = layer;
    ms.lb_loss = st.lb;
    ms.router_z = st.router_z;
    ms.required_buffer_factor = st.required_buffer_factor;
    ms.dropped_tokens = st.dropped;
    lp.moe_lb += ctx.loss->moe_lb * st.lb;
    lp.router_z += ctx.loss->router_z * st.router_z;
    lp.moe_layers.push_back(ms);
  }
  s.rs_post_ffn.resize(static_cast<size_t>(N));
  rmsnorm_forward(s.f.data(), ctx.W(post_ffn), t.data(), s.rs_post_ffn.data(), N, d, eps);
  add_into(h.data(), t.data(), N * d);
}

template <typename T>
void PeriLnBlock::backward(const Ctx<T>& ctx, Vec<T>& dh, const Saved<T>& s) const {
  const int64_t N = ctx.N, d = ctx.d;
  const double eps = ctx.c.rms_norm_eps;
  Vec<T> tmp(dh.size());
  // h_out = h_mid + RMS_post_ffn(f)
  Vec<T> df(dh.size());
  rmsnorm_backward(dh.data(), s.f.data(), ctx.W(post_ffn), s.rs_post_ffn.data(), df.data(), ctx.G(post_ffn),
                   N, d, eps);
  Vec<T> dx2(dh.size());
  if (dense)
    mlp_unit.backward(ctx, s.x2.data(), s.mlp, df.data(), dx2.data());
  else
    moe_unit.backward(ctx, s.x2.data(), s.moe, df.data(), dx2.data());
  rmsnorm_backward(dx2.data(), s.h_mid.data(), ctx.W(pre_ffn), s.rs_pre_ffn.data(), tmp.data(),
                   ctx.G(pre_ffn), N, d, eps);
  add_into(dh.data(), tmp.data(), N * d);
  // h_mid = h_in + RMS_post_attn(a)
  Vec<T> da(dh.size());
  rmsnorm_backward(dh.data(), s.a.data(), ctx.W(post_attn), s.rs_post_attn.data(), da.data(),
                   ctx.G(post_attn), N, d, eps);
  Vec<T> dx1(dh.size());
  if (kda)
    kda_unit.backward(ctx, s.x1.data(), s.kda, da.data(), dx1.data());
  else
    attn_unit.backward(ctx, s.x1.data(), s.attn, da.data(), dx1.data());
  rmsnorm_backward(dx1.data(), s.h_in.data(), ctx.W(pre_attn), s.rs_pre_attn.data(), tmp.data(),
                   ctx.G(pre_attn), N, d, eps);
  add_into(dh.data(), tmp.data(), N * d);
}

#define OLMOSFT_PERI_LN_BLOCK(T)                                                              \
  template struct PeriLnBlock::Saved<T>;                                                      \
  template void PeriLnBlock::forward<T>(const Ctx<T>&, Vec<T>&, Saved<T>&, LossParts&) const; \
  template void PeriLnBlock::backward<T>(const Ctx<T>&, Vec<T>&, const Saved<T>&) const;
OLMOSFT_PERI_LN_BLOCK(float)
OLMOSFT_PERI_LN_BLOCK(double)
#undef OLMOSFT_PERI_LN_BLOCK

PostNormBlock PostNormBlock::resolve(const ParamIndex& idx, const ModelConfig& c, int64_t l) {
  PostNormBlock u;
  const std::string p = hf::layer(l);
  u.attn = RopeAttentionUnit::resolve(idx, p + hf::kSelfAttn, c.layer_types.at(static_cast<size_t>(l)));
  u.mlp = RecomputedSwiGluMlpUnit::resolve(idx, p + hf::kMlp);
  u.post_attn = idx.get(p + hf::kPostAttnNorm);
  u.post_ffn = idx.get(p + hf::kPostFfnNorm);
  return u;
}

int64_t PostNormBlock::saved_floats_per_token(const ModelConfig& c) {
  return RopeAttentionUnit::saved_floats_per_token(c) + RecomputedSwiGluMlpUnit::saved_floats_per_token(c) +
         3 * c.hidden_size + 2;
}

void PostNormBlock::Saved::plan(FloatPlan& p, const ModelConfig& c, int64_t N) {
  attn.plan(p, c, N);
  const int64_t d = c.hidden_size;
  p.add(&a, N * d);
  p.add(&ra, N);
  p.add(&hmid, N * d);
  mlp.plan(p, c, N);
  p.add(&m, N * d);
  p.add(&rm, N);
}

void PostNormBlock::Scratch::plan(FloatPlan& p, const ModelConfig& c, int64_t N) {
  attn.plan(p, c, N);
  mlp.plan(p, c, N);
  p.add(&dtmp, N * c.hidden_size);
}

void PostNormBlock::forward(const Ctx<float>& ctx, const float* x, float* y, Saved& s, Scratch& w) const {
  const int64_t N = ctx.N, d = ctx.d;
  const double eps = ctx.c.rms_norm_eps;
  attn.forward(ctx, x, s.a, s.attn, w.attn);
  rmsnorm_forward<float>(s.a, ctx.W(post_attn), w.dtmp, s.ra, N, d, eps);
  parallel_for(
      N * d,
      [&](int64_t bb, int64_t e) {
        for (int64_t i = bb; i < e; ++i) s.hmid[i] = x[i] + w.dtmp[i];
      },
      1 << 14);
  mlp.forward(ctx, s.hmid, s.m, s.mlp, w.mlp);
  rmsnorm_forward<float>(s.m, ctx.W(post_ffn), w.dtmp, s.rm, N, d, eps);
  parallel_for(
      N * d,
      [&](int64_t bb, int64_t e) {
        for (int64_t i = bb; i < e; ++i) y[i] = s.hmid[i] + w.dtmp[i];
      },
      1 << 14);
}

void PostNormBlock::backward(const Ctx<float>& ctx, const float* x, const Saved& s, float* dh,
                             Scratch& w) const {
  const int64_t N = ctx.N, d = ctx.d;
  const double eps = ctx.c.rms_norm_eps;
  // MLP half: y = hmid + RMSNorm_ffn(m).
  rmsnorm_backward<float>(dh, s.m, ctx.W(post_ffn), s.rm, w.dtmp, ctx.G(post_ffn), N, d, eps);
  mlp.backward(ctx, s.hmid, s.mlp, w.dtmp, dh, w.mlp);
  // Attention half: hmid = x + RMSNorm_attn(a).
  rmsnorm_backward<float>(dh, s.a, ctx.W(post_attn), s.ra, w.dtmp, ctx.G(post_attn), N, d, eps);
  attn.backward(ctx, x, s.attn, w.dtmp, dh, w.attn);
}

}  // namespace olmosft::model::unit
