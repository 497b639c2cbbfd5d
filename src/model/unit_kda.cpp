// KDA mixer unit (see unit_kda.h).
#include "model/unit_kda.h"

#include <algorithm>
#include <cmath>

#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "model/params.h"

namespace olmosft::model::unit {

namespace {

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

}  // namespace

KdaUnit KdaUnit::resolve(const ParamIndex& idx, const std::string& a) {
  KdaUnit u;
  u.q = idx.get(a + hf::kQProj);
  u.k = idx.get(a + hf::kKProj);
  u.v = idx.get(a + hf::kVProj);
  u.o = idx.get(a + hf::kOProj);
  u.f1 = idx.get(a + hf::kFProj1);
  u.f2 = idx.get(a + hf::kFProj2);
  u.bproj = idx.get(a + hf::kBetaProj);
  u.A_log = idx.get(a + hf::kALog);
  u.dt_bias = idx.get(a + hf::kDtBias);
  u.qconv = idx.get(a + hf::kQConv);
  u.kconv = idx.get(a + hf::kKConv);
  u.vconv = idx.get(a + hf::kVConv);
  u.g1 = idx.get(a + hf::kGProj1);
  u.g2 = idx.get(a + hf::kGProj2);
  u.g2b = idx.get(a + hf::kGProj2Bias);
  u.onorm = idx.get(a + hf::kONorm);
  return u;
}

int64_t KdaUnit::saved_floats_per_token(const ModelConfig& c) {
  const int64_t H = c.linear_num_key_heads, KD = H * c.linear_key_head_dim, VD = H * c.linear_value_head_dim,
                R = c.linear_value_head_dim;
  // qin kin qc kc qn kn f g: KD each; vin vc o zg y: VD each; flow glow: R each; blog beta: H each.
  return 8 * KD + 5 * VD + 2 * R + 2 * H;
}

template <typename T>
size_t KdaUnit::Saved<T>::bytes() const {
  size_t n = 0;
  for (const Vec<T>* v :
       {&qin, &kin, &vin, &qc, &kc, &vc, &qn, &kn, &flow, &f, &g, &blog, &beta, &o, &glow, &zg, &y})
    n += vec_bytes(*v);
  return n;
}

template <typename T>
void KdaUnit::forward(const Ctx<T>& ctx, const T* x, T* a, Saved<T>& s) const {
  const auto kd = kdims(ctx);
  const int64_t H = kd.H, Dk = kd.K, Dv = kd.V, KD = H * Dk, VD = H * Dv, R = ctx.c.linear_value_head_dim,
                C = ctx.c.linear_conv_kernel_dim;
  s.qin.resize(static_cast<size_t>(ctx.N * KD));
  s.kin.resize(s.qin.size());
  s.vin.resize(static_cast<size_t>(ctx.N * VD));
  linear_forward(x, ctx.W(q), s.qin.data(), ctx.N, ctx.d, KD);
  linear_forward(x, ctx.W(k), s.kin.data(), ctx.N, ctx.d, KD);
  linear_forward(x, ctx.W(v), s.vin.data(), ctx.N, ctx.d, VD);
  s.qc.resize(s.qin.size());
  s.kc.resize(s.kin.size());
  s.vc.resize(s.vin.size());
  kda::short_conv_silu_forward(s.qin.data(), ctx.W(qconv), ctx.seg, ctx.b.B, ctx.b.T, KD, C, s.qc.data());
  kda::short_conv_silu_forward(s.kin.data(), ctx.W(kconv), ctx.seg, ctx.b.B, ctx.b.T, KD, C, s.kc.data());
  kda::short_conv_silu_forward(s.vin.data(), ctx.W(vconv), ctx.seg, ctx.b.B, ctx.b.T, VD, C, s.vc.data());
  s.qn.resize(s.qc.size());
  s.kn.resize(s.kc.size());
  kda::l2norm_forward(s.qc.data(), ctx.N * H, Dk, static_cast<T>(kda::kL2NormEps), s.qn.data());
  kda::l2norm_forward(s.kc.data(), ctx.N * H, Dk, static_cast<T>(kda::kL2NormEps), s.kn.data());
  s.flow.resize(static_cast<size_t>(ctx.N * R));
  linear_forward(x, ctx.W(f1), s.flow.data(), ctx.N, ctx.d, R);
  s.f.resize(static_cast<size_t>(ctx.N * KD));
  linear_forward(s.flow.data(), ctx.W(f2), s.f.data(), ctx.N, R, KD);
  s.g.resize(s.f.size());
  kda::kda_gate_forward(s.f.data(), ctx.W(A_log), ctx.W(dt_bias), ctx.N, H, Dk, s.g.data());
  s.blog.resize(static_cast<size_t>(ctx.N * H));
  linear_forward(x, ctx.W(bproj), s.blog.data(), ctx.N, ctx.d, H);
  s.beta.resize(s.blog.size());
  kda::kda_beta_forward(s.blog.data(), ctx.N * H, ctx.c.linear_allow_neg_eigval, s.beta.data());
  s.o.resize(static_cast<size_t>(ctx.N * VD));
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(Dk)));
  if (ctx.kda_recurrent)
    kda::kda_recurrent_forward(s.qn.data(), s.kn.data(), s.vc.data(), s.g.data(), s.beta.data(), ctx.seg, kd,
                               scale, s.o.data());
  else
    kda::kda_chunk_forward(s.qn.data(), s.kn.data(), s.vc.data(), s.g.data(), s.beta.data(), ctx.seg, kd,
                           scale, s.o.data(), ctx.kda_chunk);
  s.glow.resize(static_cast<size_t>(ctx.N * R));
  linear_forward(x, ctx.W(g1), s.glow.data(), ctx.N, ctx.d, R);
  s.zg.resize(static_cast<size_t>(ctx.N * VD));
  linear_forward(s.glow.data(), ctx.W(g2), s.zg.data(), ctx.N, R, VD);
  const T* bias = ctx.W(g2b);
  for (int64_t i = 0; i < ctx.N; ++i) add_into(s.zg.data() + i * VD, bias, VD);
  s.y.resize(s.o.size());
  kda::kda_output_norm_forward(s.o.data(), s.zg.data(), ctx.W(onorm), ctx.N * H, Dv,
                               static_cast<T>(ctx.c.linear_norm_eps), s.y.data());
  linear_forward(s.y.data(), ctx.W(o), a, ctx.N, VD, ctx.d);
}

template <typename T>
void KdaUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx) const {
  const auto kd = kdims(ctx);
  const int64_t H = kd.H, Dk = kd.K, Dv = kd.V, KD = H * Dk, VD = H * Dv, R = ctx.c.linear_value_head_dim,
                C = ctx.c.linear_conv_kernel_dim;
  Vec<T> dy(s.y.size()), dO(s.o.size()), dzg(s.zg.size());
  linear_backward(da, s.y.data(), ctx.W(o), dy.data(), ctx.G(o), ctx.N, VD, ctx.d);
  Vec<T> donorm_dummy;
  T* donw = ctx.G(onorm);
  if (donw == nullptr) {
    donorm_dummy.assign(static_cast<size_t>(Dv), T(0));
    donw = donorm_dummy.data();
  }
  kda::kda_output_norm_backward(s.o.data(), s.zg.data(), ctx.W(onorm), dy.data(), ctx.N * H, Dv,
                                static_cast<T>(ctx.c.linear_norm_eps), dO.data(), dzg.data(), donw);
  if (T* db = ctx.G(g2b))
    for (int64_t i = 0; i < ctx.N; ++i) add_into(db, dzg.data() + i * VD, VD);
  Vec<T> dglow(s.glow.size());
  linear_backward(dzg.data(), s.glow.data(), ctx.W(g2), dglow.data(), ctx.G(g2), ctx.N, R, VD);
  linear_backward(dglow.data(), x, ctx.W(g1), dx, ctx.G(g1), ctx.N, ctx.d, R, false);
  Vec<T> dq(s.qn.size()), dk(s.kn.size()), dv(s.vc.size()), dg(s.g.size()), dbeta(s.beta.size());
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(Dk)));
  if (ctx.kda_recurrent)
    kda::kda_recurrent_backward(s.qn.data(), s.kn.data(), s.vc.data(), s.g.data(), s.beta.data(), ctx.seg, kd,
                                scale, dO.data(), dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data());
  else
    kda::kda_chunk_backward(s.qn.data(), s.kn.data(), s.vc.data(), s.g.data(), s.beta.data(), ctx.seg, kd,
                            scale, dO.data(), dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(),
                            ctx.kda_chunk);
  Vec<T> dblog(s.blog.size());
  kda::kda_beta_backward(s.blog.data(), dbeta.data(), ctx.N * H, ctx.c.linear_allow_neg_eigval, dblog.data());
  linear_backward(dblog.data(), x, ctx.W(bproj), dx, ctx.G(bproj), ctx.N, ctx.d, H, true);
  Vec<T> df(s.f.size());
  Vec<T> dA_dummy, ddt_dummy;
  T* dA = ctx.G(A_log);
  T* ddt = ctx.G(dt_bias);
  if (dA == nullptr) {
    dA_dummy.assign(static_cast<size_t>(H), T(0));
    ddt_dummy.assign(static_cast<size_t>(KD), T(0));
    dA = dA_dummy.data();
    ddt = ddt_dummy.data();
  }
  kda::kda_gate_backward(s.f.data(), ctx.W(A_log), ctx.W(dt_bias), dg.data(), ctx.N, H, Dk, df.data(), dA,
                         ddt);
  Vec<T> dflow(s.flow.size());
  linear_backward(df.data(), s.flow.data(), ctx.W(f2), dflow.data(), ctx.G(f2), ctx.N, R, KD);
  linear_backward(dflow.data(), x, ctx.W(f1), dx, ctx.G(f1), ctx.N, ctx.d, R, true);
  // q, k, v: l2norm, conv + SiLU, projection.
  Vec<T> dc(std::max(s.qc.size(), s.vc.size())), din(dc.size());
  Vec<T> dconv_dummy;
  auto conv_grad = [&](int idx, int64_t CC) -> T* {
    T* p = ctx.G(idx);
    if (p) return p;
    dconv_dummy.assign(static_cast<size_t>(CC * C), T(0));
    return dconv_dummy.data();
  };
  kda::l2norm_backward(s.qc.data(), dq.data(), ctx.N * H, Dk, static_cast<T>(kda::kL2NormEps), dc.data());
  kda::short_conv_silu_backward(s.qin.data(), ctx.W(qconv), ctx.seg, ctx.b.B, ctx.b.T, KD, C, dc.data(),
                                din.data(), conv_grad(qconv, KD));
  linear_backward(din.data(), x, ctx.W(q), dx, ctx.G(q), ctx.N, ctx.d, KD, true);
  kda::l2norm_backward(s.kc.data(), dk.data(), ctx.N * H, Dk, static_cast<T>(kda::kL2NormEps), dc.data());
  kda::short_conv_silu_backward(s.kin.data(), ctx.W(kconv), ctx.seg, ctx.b.B, ctx.b.T, KD, C, dc.data(),
                                din.data(), conv_grad(kconv, KD));
  linear_backward(din.data(), x, ctx.W(k), dx, ctx.G(k), ctx.N, ctx.d, KD, true);
  kda::short_conv_silu_backward(s.vin.data(), ctx.W(vconv), ctx.seg, ctx.b.B, ctx.b.T, VD, C, dv.data(),
                                din.data(), conv_grad(vconv, VD));
  linear_backward(din.data(), x, ctx.W(v), dx, ctx.G(v), ctx.N, ctx.d, VD, true);
}

#define OLMOSFT_KDA_UNIT(T)                                                        \
  template struct KdaUnit::Saved<T>;                                               \
  template void KdaUnit::forward<T>(const Ctx<T>&, const T*, T*, Saved<T>&) const; \
  template void KdaUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, const T*, T*) const;
OLMOSFT_KDA_UNIT(float)
OLMOSFT_KDA_UNIT(double)
#undef OLMOSFT_KDA_UNIT

}  // namespace olmosft::model::unit
