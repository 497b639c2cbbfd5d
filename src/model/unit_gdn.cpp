// Gated DeltaNet mixer unit (see unit_gdn.h).
#include "model/unit_gdn.h"

#include <algorithm>
#include <cmath>

#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "model/params.h"

namespace olmosft::model::unit {

namespace {

struct GdnDims {
  int64_t H, Dk, Dv, KD, VD, C;
};

GdnDims gdims(const ModelConfig& c) {
  const int64_t H = c.linear_num_key_heads, Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
  return {H, Dk, Dv, H * Dk, H * Dv, c.linear_conv_kernel_dim};
}

template <typename T>
kda::KdaDims kdims(const Ctx<T>& ctx) {
  kda::KdaDims kd;
  kd.B = ctx.b.B;
  kd.L = ctx.b.T;
  kd.H = ctx.c.linear_num_key_heads;
  kd.K = ctx.c.linear_key_head_dim;
  kd.V = ctx.c.linear_value_head_dim;
  return kd;
}

// gk[n, h, c] = g[n, h]: the per-head decay as the delta-rule kernels' per-channel one.
template <typename T>
void broadcast_decay(const T* g, int64_t NH, int64_t Dk, T* gk) {
  for (int64_t i = 0; i < NH; ++i) std::fill(gk + i * Dk, gk + (i + 1) * Dk, g[i]);
}

// dg[n, h] = sum_c dgk[n, h, c] (the broadcast's backward).
template <typename T>
void sum_decay_grad(const T* dgk, int64_t NH, int64_t Dk, T* dg) {
  for (int64_t i = 0; i < NH; ++i) {
    T s = 0;
    for (int64_t c = 0; c < Dk; ++c) s += dgk[i * Dk + c];
    dg[i] = s;
  }
}

}  // namespace

GdnUnit GdnUnit::resolve(const ParamIndex& idx, const std::string& p, const LayerSpec&) {
  GdnUnit u;
  u.q = idx.get(p + hf::kQProj);
  u.k = idx.get(p + hf::kKProj);
  u.v = idx.get(p + hf::kVProj);
  u.a = idx.get(p + hf::kAProj);
  u.b = idx.get(p + hf::kBProj);
  u.g = idx.get(p + hf::kGProj);
  u.o = idx.get(p + hf::kOProj);
  u.A_log = idx.get(p + hf::kALog);
  u.dt_bias = idx.get(p + hf::kDtBias);
  u.conv = idx.get(p + hf::kConv1d);
  u.onorm = idx.get(p + hf::kONorm);
  return u;
}

int64_t GdnUnit::saved_floats_per_token(const ModelConfig& c) {
  const GdnDims g = gdims(c);
  // qin kin qc kc qn kn: KD each; vin vc out z y: VD each; araw gh blog beta: H each.
  return 6 * g.KD + 5 * g.VD + 4 * g.H;
}

double GdnUnit::gemm_weights_per_token(const ModelConfig& c) {
  const GdnDims g = gdims(c);
  const double d = static_cast<double>(c.hidden_size);
  // q, k, v; a, b (one per head); g (the output gate); o.
  return d * static_cast<double>(2 * g.KD + g.VD) + d * static_cast<double>(2 * g.H) +
         2 * d * static_cast<double>(g.VD);
}

template <typename T>
void GdnUnit::Saved<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const GdnDims g = gdims(c);
  for (T** b : {&qin, &kin, &qc, &kc, &qn, &kn}) p.add_activation(b, N * g.KD);
  for (T** b : {&vin, &vc, &out, &z, &y}) p.add_activation(b, N * g.VD);
  // the decay and beta (log space and per head) stay fp32
  for (T** b : {&araw, &gh, &blog, &beta}) p.add(b, N * g.H);
}

template <typename T>
int64_t GdnUnit::Scratch<T>::per_token(const ModelConfig& c) {
  const GdnDims g = gdims(c);
  // gk dq dk dgk: KD; dy dO dz dv: VD; dg da dbeta dblog: H; dc din: max(KD, VD).
  return 4 * g.KD + 4 * g.VD + 4 * g.H + 2 * std::max(g.KD, g.VD);
}

template <typename T>
void GdnUnit::Scratch<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const GdnDims g = gdims(c);
  for (T** b : {&gk, &dq, &dk, &dgk}) p.add(b, N * g.KD);
  for (T** b : {&dy, &dO, &dz, &dv}) p.add(b, N * g.VD);
  for (T** b : {&dg, &da, &dbeta, &dblog}) p.add(b, N * g.H);
  for (T** b : {&dc, &din}) p.add(b, N * std::max(g.KD, g.VD));
  p.add(&donorm, g.Dv);
  p.add(&dA, g.H);
  p.add(&ddt, g.H);
  p.add(&dconv, (2 * g.KD + g.VD) * g.C);
}

template <typename T>
void GdnUnit::forward(const Ctx<T>& ctx, const T* x, T* out_, const Saved<T>& s, const Scratch<T>& w) const {
  const GdnDims gd = gdims(ctx.c);
  const int64_t N = ctx.N, d = ctx.d, B = ctx.b.B, L = ctx.b.T, C = gd.C;
  const T* wc = ctx.W(conv);  // rows [q | k | v], K taps each
  linear_forward(x, ctx.W(q), s.qin, N, d, gd.KD);
  linear_forward(x, ctx.W(k), s.kin, N, d, gd.KD);
  linear_forward(x, ctx.W(v), s.vin, N, d, gd.VD);
  kda::short_conv_silu_forward(s.qin, wc, ctx.seg, B, L, gd.KD, C, s.qc);
  kda::short_conv_silu_forward(s.kin, wc + gd.KD * C, ctx.seg, B, L, gd.KD, C, s.kc);
  kda::short_conv_silu_forward(s.vin, wc + 2 * gd.KD * C, ctx.seg, B, L, gd.VD, C, s.vc);
  kda::l2norm_forward(s.qc, N * gd.H, gd.Dk, static_cast<T>(kda::kL2NormEps), s.qn);
  kda::l2norm_forward(s.kc, N * gd.H, gd.Dk, static_cast<T>(kda::kL2NormEps), s.kn);
  linear_forward(x, ctx.W(a), s.araw, N, d, gd.H);
  kda::kda_gate_forward(s.araw, ctx.W(A_log), ctx.W(dt_bias), N, gd.H, int64_t{1}, s.gh);
  broadcast_decay(s.gh, N * gd.H, gd.Dk, w.gk);
  linear_forward(x, ctx.W(b), s.blog, N, d, gd.H);
  kda::kda_beta_forward(s.blog, N * gd.H, ctx.c.linear_allow_neg_eigval, s.beta);
  const auto kd = kdims(ctx);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(gd.Dk)));
  if (ctx.kda_recurrent)
    kda::kda_recurrent_forward(s.qn, s.kn, s.vc, w.gk, s.beta, ctx.seg, kd, scale, s.out);
  else
    kda::kda_chunk_forward(s.qn, s.kn, s.vc, w.gk, s.beta, ctx.seg, kd, scale, s.out, ctx.kda_chunk);
  linear_forward(x, ctx.W(g), s.z, N, d, gd.VD);
  kda::kda_output_norm_forward(s.out, s.z, ctx.W(onorm), N * gd.H, gd.Dv,
                               static_cast<T>(ctx.c.linear_norm_eps), s.y, kda::GateAct::Silu);
  linear_forward(s.y, ctx.W(o), out_, N, gd.VD, d);
}

template <typename T>
void GdnUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* dout, T* dx,
                       const Scratch<T>& w) const {
  const GdnDims gd = gdims(ctx.c);
  const int64_t N = ctx.N, d = ctx.d, B = ctx.b.B, L = ctx.b.T, C = gd.C;
  // A stand-in for an absent parameter gradient: zeroed scratch, discarded.
  auto grad_or = [](T* gr, T* stand_in, int64_t n) {
    if (gr != nullptr) return gr;
    std::fill(stand_in, stand_in + n, T(0));
    return stand_in;
  };
  linear_backward(dout, s.y, ctx.W(o), w.dy, ctx.G(o), N, gd.VD, d);
  kda::kda_output_norm_backward(s.out, s.z, ctx.W(onorm), w.dy, N * gd.H, gd.Dv,
                                static_cast<T>(ctx.c.linear_norm_eps), w.dO, w.dz,
                                grad_or(ctx.G(onorm), w.donorm, gd.Dv), kda::GateAct::Silu);
  linear_backward(w.dz, x, ctx.W(g), dx, ctx.G(g), N, d, gd.VD, true);
  broadcast_decay(s.gh, N * gd.H, gd.Dk, w.gk);  // the scratch is shared by the layers: rebuild it
  const auto kd = kdims(ctx);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(gd.Dk)));
  if (ctx.kda_recurrent)
    kda::kda_recurrent_backward(s.qn, s.kn, s.vc, w.gk, s.beta, ctx.seg, kd, scale, w.dO, w.dq, w.dk, w.dv,
                                w.dgk, w.dbeta);
  else
    kda::kda_chunk_backward(s.qn, s.kn, s.vc, w.gk, s.beta, ctx.seg, kd, scale, w.dO, w.dq, w.dk, w.dv, w.dgk,
                            w.dbeta, ctx.kda_chunk);
  kda::kda_beta_backward(s.blog, w.dbeta, N * gd.H, ctx.c.linear_allow_neg_eigval, w.dblog);
  linear_backward(w.dblog, x, ctx.W(b), dx, ctx.G(b), N, d, gd.H, true);
  sum_decay_grad(w.dgk, N * gd.H, gd.Dk, w.dg);
  T* dA = ctx.G(A_log);
  T* ddt = ctx.G(dt_bias);
  if (dA == nullptr || ddt == nullptr) {
    dA = grad_or(dA, w.dA, gd.H);
    ddt = grad_or(ddt, w.ddt, gd.H);
  }
  kda::kda_gate_backward(s.araw, ctx.W(A_log), ctx.W(dt_bias), w.dg, N, gd.H, int64_t{1}, w.da, dA, ddt);
  linear_backward(w.da, x, ctx.W(a), dx, ctx.G(a), N, d, gd.H, true);
  // q, k, v: l2norm (q, k), conv + SiLU over the fused weight's rows, projection.
  T* dconv = grad_or(ctx.G(conv), w.dconv, (2 * gd.KD + gd.VD) * C);
  const T* wc = ctx.W(conv);
  kda::l2norm_backward(s.qc, w.dq, N * gd.H, gd.Dk, static_cast<T>(kda::kL2NormEps), w.dc);
  kda::short_conv_silu_backward(s.qin, wc, ctx.seg, B, L, gd.KD, C, w.dc, w.din, dconv);
  linear_backward(w.din, x, ctx.W(q), dx, ctx.G(q), N, d, gd.KD, true);
  kda::l2norm_backward(s.kc, w.dk, N * gd.H, gd.Dk, static_cast<T>(kda::kL2NormEps), w.dc);
  kda::short_conv_silu_backward(s.kin, wc + gd.KD * C, ctx.seg, B, L, gd.KD, C, w.dc, w.din,
                                dconv + gd.KD * C);
  linear_backward(w.din, x, ctx.W(k), dx, ctx.G(k), N, d, gd.KD, true);
  kda::short_conv_silu_backward(s.vin, wc + 2 * gd.KD * C, ctx.seg, B, L, gd.VD, C, w.dv, w.din,
                                dconv + 2 * gd.KD * C);
  linear_backward(w.din, x, ctx.W(v), dx, ctx.G(v), N, d, gd.VD, true);
}

#define OLMOSFT_GDN(T)                                                                                      \
  template struct GdnUnit::Saved<T>;                                                                        \
  template struct GdnUnit::Scratch<T>;                                                                      \
  template void GdnUnit::forward<T>(const Ctx<T>&, const T*, T*, const Saved<T>&, const Scratch<T>&) const; \
  template void GdnUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, const T*, T*,                \
                                     const Scratch<T>&) const;
OLMOSFT_GDN(float)
OLMOSFT_GDN(double)
#undef OLMOSFT_GDN

}  // namespace olmosft::model::unit
