// Dense SwiGLU MLP and latent MoE units (see unit_ffn.h).
#include "model/unit_ffn.h"

#include <cmath>

#include "kernels/gemm.h"
#include "kernels/swiglu.h"
#include "model/params.h"

namespace olmosft::model::unit {

namespace {

template <typename T>
moe::MoeDims moe_dims(const Ctx<T>& ctx) {
  const ModelConfig& c = ctx.c;
  moe::MoeDims m;
  m.d = ctx.d;
  m.experts = c.n_routed_experts;
  m.top_k = c.num_experts_per_tok;
  m.expert_hidden = c.moe_intermediate_size;
  m.latent = c.latent_moe_dim;
  m.shared_hidden = c.shared_expert_intermediate_size;
  if (c.original_num_experts_per_tok && *c.original_num_experts_per_tok != c.num_experts_per_tok)
    m.weight_mult = std::sqrt(static_cast<double>(*c.original_num_experts_per_tok) /
                              static_cast<double>(c.num_experts_per_tok));
  m.buffer_factor = ctx.loss->moe_buffer_factor;
  return m;
}

// Refills the weight pointer table m (its vectors keep their capacity).
template <typename T>
void moe_weights(const MoeUnit& u, const Ctx<T>& ctx, moe::MoeWeights<T>& m) {
  m.router = ctx.W(u.router);
  if (u.ldown >= 0) {
    m.latent_down = ctx.W(u.ldown);
    m.latent_up = ctx.W(u.lup);
  }
  m.gate.resize(u.eg.size());
  m.up.resize(u.eg.size());
  m.down.resize(u.eg.size());
  for (size_t e = 0; e < u.eg.size(); ++e) {
    m.gate[e] = ctx.W(u.eg[e]);
    m.up[e] = ctx.W(u.eu[e]);
    m.down[e] = ctx.W(u.ed[e]);
  }
  if (u.sh_g >= 0) {
    m.shared_gate = ctx.W(u.sh_g);
    m.shared_up = ctx.W(u.sh_u);
    m.shared_down = ctx.W(u.sh_d);
  }
}

// Refills the gradient pointer table m.
template <typename T>
void moe_grads(const MoeUnit& u, const Ctx<T>& ctx, moe::MoeGrads<T>& m) {
  m.router = ctx.G(u.router);
  m.latent_down = ctx.G(u.ldown);
  m.latent_up = ctx.G(u.lup);
  m.gate.resize(u.eg.size());
  m.up.resize(u.eg.size());
  m.down.resize(u.eg.size());
  for (size_t e = 0; e < u.eg.size(); ++e) {
    m.gate[e] = ctx.G(u.eg[e]);
    m.up[e] = ctx.G(u.eu[e]);
    m.down[e] = ctx.G(u.ed[e]);
  }
  m.shared_gate = ctx.G(u.sh_g);
  m.shared_up = ctx.G(u.sh_u);
  m.shared_down = ctx.G(u.sh_d);
}

}  // namespace

SwiGluUnit SwiGluUnit::resolve(const ParamIndex& idx, const std::string& m, int64_t hidden) {
  SwiGluUnit u;
  u.gate = idx.get(m + hf::kGateProj);
  u.up = idx.get(m + hf::kUpProj);
  u.down = idx.get(m + hf::kDownProj);
  u.hidden = hidden;
  return u;
}

template <typename T>
void SwiGluUnit::forward(const Ctx<T>& ctx, const T* x, T* f, const Saved<T>& s, const Scratch<T>& w) const {
  const int64_t N = ctx.N, d = ctx.d, F = hidden;
  linear_forward(x, ctx.W(gate), s.a, N, d, F);
  linear_forward(x, ctx.W(up), s.b, N, d, F);
  swiglu_forward(s.a, s.b, w.act, N * F);
  linear_forward(w.act, ctx.W(down), f, N, F, d);
}

template <typename T>
void SwiGluUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* df, T* dx,
                          const Scratch<T>& w) const {
  const int64_t N = ctx.N, d = ctx.d, F = hidden;
  swiglu_forward(s.a, s.b, w.act, N * F);  // recompute the hidden product
  linear_backward(df, w.act, ctx.W(down), w.dact, ctx.G(down), N, F, d);
  // da (gate) overwrites dact (each element's dh is read before it is written); db (up) goes to act.
  swiglu_backward(w.dact, F, s.a, F, s.b, F, w.dact, F, w.act, F, N, F);
  linear_backward(w.dact, x, ctx.W(gate), dx, ctx.G(gate), N, d, F, true);
  linear_backward(w.act, x, ctx.W(up), dx, ctx.G(up), N, d, F, true);
}

xla::Value SwiGluUnit::emit_forward(Emit& e, const xla::Value& x, Emitted& s) const {
  s.a = xla::ops::linear_forward(e.b, x, e.W(gate), e.operands);
  s.b = xla::ops::linear_forward(e.b, x, e.W(up), e.operands);
  return xla::ops::linear_forward(e.b, xla::ops::swiglu_forward(e.b, *s.a, *s.b), e.W(down), e.operands);
}

xla::Value SwiGluUnit::emit_backward(Emit& e, const xla::Value& x, const Emitted& s,
                                     const xla::Value& df) const {
  namespace ops = xla::ops;
  const xla::Value act = ops::swiglu_forward(e.b, *s.a, *s.b);
  const ops::LinearBackward ld = ops::linear_backward(e.b, df, act, e.W(down), e.operands);
  const ops::SwigluBackward sb = ops::swiglu_backward(e.b, ld.dx, *s.a, *s.b);
  const ops::LinearBackward lg = ops::linear_backward(e.b, sb.da, x, e.W(gate), e.operands);
  const ops::LinearBackward lu = ops::linear_backward(e.b, sb.db, x, e.W(up), e.operands);
  e.grad(down, ld.dw);
  e.grad(gate, lg.dw);
  e.grad(up, lu.dw);
  return e.b.add(lg.dx, lu.dx);
}

MoeUnit MoeUnit::resolve(const ParamIndex& idx, const std::string& m, const ModelConfig& c) {
  MoeUnit u;
  u.router = idx.get(m + hf::kRouter);
  u.ldown = idx.get(m + hf::kLatentDown, false);
  u.lup = idx.get(m + hf::kLatentUp, false);
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    const std::string x = m + hf::expert(e);
    u.eg.push_back(idx.get(x + hf::kGateProj));
    u.eu.push_back(idx.get(x + hf::kUpProj));
    u.ed.push_back(idx.get(x + hf::kDownProj));
  }
  u.sh_g = idx.get(m + hf::shared_expert(hf::kGateProj), false);
  u.sh_u = idx.get(m + hf::shared_expert(hf::kUpProj), false);
  u.sh_d = idx.get(m + hf::shared_expert(hf::kDownProj), false);
  return u;
}

double MoeUnit::gemm_weights_per_token(const ModelConfig& c) {
  const double d = static_cast<double>(c.hidden_size), Lt = static_cast<double>(c.latent_moe_dim);
  return d * static_cast<double>(c.n_routed_experts) + (c.latent_moe_dim > 0 ? 2 * d * Lt : 0.0) +
         3 * d * static_cast<double>(c.shared_expert_intermediate_size);
}

double MoeUnit::gemm_weights_per_routed(const ModelConfig& c) {
  const double Lt = static_cast<double>(c.latent_moe_dim > 0 ? c.latent_moe_dim : c.hidden_size);
  return 3 * Lt * static_cast<double>(c.moe_intermediate_size);
}

int64_t MoeUnit::saved_floats_per_token(const ModelConfig& c) {
  return c.n_routed_experts + 1 + 3 * c.num_experts_per_tok + 2 * c.latent_moe_dim +
         3 * c.shared_expert_intermediate_size;
}

template <typename T>
moe::MoeStats MoeUnit::forward(const Ctx<T>& ctx, const T* x, T* f, Saved<T>& s) const {
  moe_weights(*this, ctx, s.w);
  return moe::moe_forward(moe_dims(ctx), s.w, x, ctx.valid, ctx.N, f, s.cache);
}

template <typename T>
void MoeUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* df, T* dx) const {
  moe_weights(*this, ctx, s.w);  // the residency hooks may have moved the weights since the forward
  moe_grads(*this, ctx, s.g);
  moe::moe_backward(moe_dims(ctx), s.w, s.g, x, s.cache, df, ctx.aux_scale * ctx.loss->weight[kLossMoeLb],
                    ctx.aux_scale * ctx.loss->weight[kLossRouterZ], dx);
}

#define OLMOSFT_FFN_UNITS(T)                                                                            \
  template void SwiGluUnit::forward<T>(const Ctx<T>&, const T*, T*, const Saved<T>&, const Scratch<T>&) \
      const;                                                                                            \
  template void SwiGluUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, const T*, T*,         \
                                        const Scratch<T>&) const;                                       \
  template moe::MoeStats MoeUnit::forward<T>(const Ctx<T>&, const T*, T*, Saved<T>&) const;             \
  template void MoeUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, const T*, T*) const;
OLMOSFT_FFN_UNITS(float)
OLMOSFT_FFN_UNITS(double)
#undef OLMOSFT_FFN_UNITS

}  // namespace olmosft::model::unit
