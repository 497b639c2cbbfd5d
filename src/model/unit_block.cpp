// The hybrid's peri-LN block (see unit_block.h).
#include "model/unit_block.h"

#include <algorithm>

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
void PeriLnBlock::Saved<T>::plan(Plan& p, const ModelConfig& c, int64_t l, int64_t N, bool input,
                                 bool mixer) {
  const int64_t d = c.hidden_size;
  if (input) p.add(&h_in, N * d);  // fp32 under saved_dtype bf16 too, as the block input it copies
  for (T** b : {&x1, &a, &h_mid, &x2, &f}) p.add_activation(b, N * d);
  for (T** b : {&rs_pre_attn, &rs_post_attn, &rs_pre_ffn, &rs_post_ffn}) p.add(b, N);
  const bool is_kda = c.layer_types[static_cast<size_t>(l)] == LayerType::LinearAttention;
  if (mixer && is_kda) kda.plan(p, c, N);
  if (mixer && !is_kda) attn.plan(p, c, N);
  if (c.is_dense_layer(l)) mlp.plan(p, c, N);
}

namespace {
// Whether the config has KDA / softmax-attention layers.
void mixer_kinds(const ModelConfig& c, bool* has_kda, bool* has_attn) {
  *has_kda = *has_attn = false;
  for (const LayerType lt : c.layer_types) (lt == LayerType::LinearAttention ? *has_kda : *has_attn) = true;
}
}  // namespace

template <typename T>
void PeriLnBlock::Scratch<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  for (T** b : {&t, &dA, &dX}) p.add(b, N * c.hidden_size);
  bool has_kda, has_attn;
  mixer_kinds(c, &has_kda, &has_attn);
  if (has_kda) kda.plan(p, c, N);
  if (has_attn) attn.plan(p, c, N);
}

template <typename T>
int64_t PeriLnBlock::Scratch<T>::per_token(const ModelConfig& c) {
  bool has_kda, has_attn;
  mixer_kinds(c, &has_kda, &has_attn);
  return 3 * c.hidden_size + (has_kda ? KdaUnit::Scratch<T>::per_token(c) : 0) +
         (has_attn ? SoftmaxAttentionUnit::Scratch<T>::per_token(c) : 0);
}

template <typename T>
void PeriLnBlock::forward(const Ctx<T>& ctx, T* h, Saved<T>& s, const Scratch<T>& w, LossParts& lp) const {
  const int64_t N = ctx.N, d = ctx.d;
  const double eps = ctx.c.rms_norm_eps;
  std::copy(h, h + N * d, s.h_in);
  rmsnorm_forward(h, ctx.W(pre_attn), s.x1, s.rs_pre_attn, N, d, eps);
  if (kda)
    kda_unit.forward(ctx, s.x1, s.a, s.kda);
  else
    attn_unit.forward(ctx, s.x1, s.a, s.attn);
  rmsnorm_forward(s.a, ctx.W(post_attn), w.t, s.rs_post_attn, N, d, eps);
  add_into(h, w.t, N * d);
  std::copy(h, h + N * d, s.h_mid);
  rmsnorm_forward(h, ctx.W(pre_ffn), s.x2, s.rs_pre_ffn, N, d, eps);
  if (dense) {
    mlp_unit.forward(ctx, s.x2, s.f, s.mlp);
  } else {
    const moe::MoeStats st = moe_unit.forward(ctx, s.x2, s.f, s.moe);
    MoeLayerStats ms;
    ms.layer = layer;
    ms.lb_loss = st.lb;
    ms.router_z = st.router_z;
    ms.required_buffer_factor = st.required_buffer_factor;
    ms.dropped_tokens = st.dropped;
    lp.sum[kLossMoeLb] += ctx.loss->weight[kLossMoeLb] * st.lb;
    lp.sum[kLossRouterZ] += ctx.loss->weight[kLossRouterZ] * st.router_z;
    lp.moe_layers.push_back(ms);
  }
  rmsnorm_forward(s.f, ctx.W(post_ffn), w.t, s.rs_post_ffn, N, d, eps);
  add_into(h, w.t, N * d);
}

template <typename T>
void PeriLnBlock::backward(const Ctx<T>& ctx, T* dh, const Saved<T>& s, const Scratch<T>& w) const {
  const int64_t N = ctx.N, d = ctx.d;
  const double eps = ctx.c.rms_norm_eps;
  // h_out = h_mid + RMS_post_ffn(f):  dA = df, dX = dx2
  rmsnorm_backward(dh, s.f, ctx.W(post_ffn), s.rs_post_ffn, w.dA, ctx.G(post_ffn), N, d, eps);
  if (dense)
    mlp_unit.backward(ctx, s.x2, s.mlp, w.dA, w.dX);
  else
    moe_unit.backward(ctx, s.x2, s.moe, w.dA, w.dX);
  rmsnorm_backward(w.dX, s.h_mid, ctx.W(pre_ffn), s.rs_pre_ffn, w.t, ctx.G(pre_ffn), N, d, eps);
  add_into(dh, w.t, N * d);
  // h_mid = h_in + RMS_post_attn(a):  dA = da, dX = dx1
  rmsnorm_backward(dh, s.a, ctx.W(post_attn), s.rs_post_attn, w.dA, ctx.G(post_attn), N, d, eps);
  if (ctx.recompute_mixer) {  // the mixer's Saved is shared by the layers: re-run this layer's into it
    if (kda)
      kda_unit.forward(ctx, s.x1, w.t, s.kda);
    else
      attn_unit.forward(ctx, s.x1, w.t, s.attn);
  }
  if (kda)
    kda_unit.backward(ctx, s.x1, s.kda, w.dA, w.dX, w.kda);
  else
    attn_unit.backward(ctx, s.x1, s.attn, w.dA, w.dX, w.attn);
  rmsnorm_backward(w.dX, s.h_in, ctx.W(pre_attn), s.rs_pre_attn, w.t, ctx.G(pre_attn), N, d, eps);
  add_into(dh, w.t, N * d);
}

#define OLMOSFT_PERI_LN_BLOCK(T)                                                                            \
  template struct PeriLnBlock::Saved<T>;                                                                    \
  template struct PeriLnBlock::Scratch<T>;                                                                  \
  template void PeriLnBlock::forward<T>(const Ctx<T>&, T*, Saved<T>&, const Scratch<T>&, LossParts&) const; \
  template void PeriLnBlock::backward<T>(const Ctx<T>&, T*, const Saved<T>&, const Scratch<T>&) const;
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

void PostNormBlock::Saved::plan(Plan& p, const ModelConfig& c, int64_t N, bool with_attn) {
  if (with_attn) attn.plan(p, c, N);
  const int64_t d = c.hidden_size;
  p.add_activation(&a, N * d);
  p.add(&ra, N);
  p.add_activation(&hmid, N * d);
  mlp.plan(p, c, N);
  p.add_activation(&m, N * d);
  p.add(&rm, N);
}

void PostNormBlock::Scratch::plan(Plan& p, const ModelConfig& c, int64_t N) {
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
  // remat attn: the attention Saved is shared by the layers; re-run this layer's (a is rewritten with the
  // same values, and is not read again)
  if (ctx.recompute_mixer) attn.forward(ctx, x, s.a, s.attn, w.attn);
  attn.backward(ctx, x, s.attn, w.dtmp, dh, w.attn);
}

}  // namespace olmosft::model::unit
