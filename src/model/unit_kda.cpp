// KDA mixer unit (see unit_kda.h).
#include "model/unit_kda.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "model/delta_rule_emit.h"
#include "model/params.h"

namespace olmosft::model::unit {

void KdaUnit::params(Params& p, const ModelConfig& c, const LayerSpec& spec) {
  const std::string a = hf::layer(spec.index) + kPrefix;
  const int64_t d = c.hidden_size, H = c.linear_num_key_heads, dv = c.linear_value_head_dim,
                kd = H * c.linear_key_head_dim, vd = H * dv, K = c.linear_conv_kernel_dim;
  p.add(q, a + hf::kQProj, {kd, d});
  p.add(k, a + hf::kKProj, {kd, d});
  p.add(v, a + hf::kVProj, {vd, d});
  p.add(f1, a + hf::kFProj1, {dv, d});
  p.add(f2, a + hf::kFProj2, {kd, dv});
  p.add(bproj, a + hf::kBetaProj, {H, d});
  p.add(A_log, a + hf::kALog, {H}, false, true);
  p.add(dt_bias, a + hf::kDtBias, {kd}, false, true);
  p.add(qconv, a + hf::kQConv, {kd, 1, K});
  p.add(kconv, a + hf::kKConv, {kd, 1, K});
  p.add(vconv, a + hf::kVConv, {vd, 1, K});
  p.add(g1, a + hf::kGProj1, {dv, d});
  p.add(g2, a + hf::kGProj2, {vd, dv});
  p.add(g2b, a + hf::kGProj2Bias, {vd});
  p.add(onorm, a + hf::kONorm, {dv});
  p.add(o, a + hf::kOProj, {d, vd});
}

int64_t KdaUnit::saved_floats_per_token(const ModelConfig& c) {
  const int64_t H = c.linear_num_key_heads, KD = H * c.linear_key_head_dim, VD = H * c.linear_value_head_dim,
                R = c.linear_value_head_dim;
  // qin kin qc kc qn kn f g: KD each; vin vc o zg y vn: VD each; flow glow: R each; blog beta: H each.
  return 8 * KD + 6 * VD + 2 * R + 2 * H;
}

double KdaUnit::gemm_weights_per_token(const ModelConfig& c) {
  const double d = static_cast<double>(c.hidden_size), Hl = static_cast<double>(c.linear_num_key_heads),
               KD = Hl * static_cast<double>(c.linear_key_head_dim),
               R = static_cast<double>(c.linear_value_head_dim), VD = Hl * R;
  // q, k, v, f_proj_1/2 (rank R = value head dim), beta, g_proj_1/2, o.
  return d * (2 * KD + VD) + (d * R + R * KD) + d * Hl + (d * R + R * VD) + VD * d;
}

template <typename T>
void KdaUnit::Saved<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const int64_t H = c.linear_num_key_heads, KD = H * c.linear_key_head_dim, VD = H * c.linear_value_head_dim,
                R = c.linear_value_head_dim;
  // the projections and their conv / norm outputs, the delta rule's output and the gated norm's: activations;
  // the decay gates f, g (log space, summed over a chunk) and the per-head gates stay fp32
  for (T** b : {&qin, &kin, &qc, &kc, &qn, &kn}) p.add_activation(b, N * KD);
  for (T** b : {&f, &g}) p.add(b, N * KD);
  for (T** b : {&vin, &vc, &o, &zg, &y}) p.add_activation(b, N * VD);
  for (T** b : {&flow, &glow}) p.add(b, N * R);
  for (T** b : {&blog, &beta}) p.add(b, N * H);
  p.add(&vn, N * VD);  // fp32: the backward's state pass reads it as the forward computed it
}

template <typename T>
int64_t KdaUnit::Scratch<T>::per_token(const ModelConfig& c) {
  const int64_t H = c.linear_num_key_heads, KD = H * c.linear_key_head_dim, VD = H * c.linear_value_head_dim,
                R = c.linear_value_head_dim;
  // dy dO dzg dv: VD; dq dk dg df: KD; dglow dflow: R; dbeta dblog: H; dc din: max(KD, VD).
  return 4 * VD + 4 * KD + 2 * R + 2 * H + 2 * std::max(KD, VD);
}

template <typename T>
void KdaUnit::Scratch<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const int64_t H = c.linear_num_key_heads, Dv = c.linear_value_head_dim, KD = H * c.linear_key_head_dim,
                VD = H * Dv, R = Dv, C = c.linear_conv_kernel_dim;
  for (T** b : {&dy, &dO, &dzg, &dv}) p.add(b, N * VD);
  for (T** b : {&dq, &dk, &dg, &df}) p.add(b, N * KD);
  for (T** b : {&dglow, &dflow}) p.add(b, N * R);
  for (T** b : {&dbeta, &dblog}) p.add(b, N * H);
  for (T** b : {&dc, &din}) p.add(b, N * std::max(KD, VD));
  p.add(&donorm, Dv);
  p.add(&dA, H);
  p.add(&ddt, KD);
  p.add(&dconv, std::max(KD, VD) * C);
}

template <typename T>
void KdaUnit::forward(const Ctx<T>& ctx, const T* x, T* a, const Saved<T>& s, const Scratch<T>&) const {
  const auto kd = delta_rule_dims(ctx, ctx.c.linear_num_key_heads);
  const int64_t H = kd.H, Dk = kd.K, Dv = kd.V, KD = H * Dk, VD = H * Dv, R = ctx.c.linear_value_head_dim,
                C = ctx.c.linear_conv_kernel_dim;
  linear_forward(x, ctx.W(q), s.qin, ctx.N, ctx.d, KD);
  linear_forward(x, ctx.W(k), s.kin, ctx.N, ctx.d, KD);
  linear_forward(x, ctx.W(v), s.vin, ctx.N, ctx.d, VD);
  kda::short_conv_silu_forward(s.qin, ctx.W(qconv), ctx.seg, ctx.b.B, ctx.b.T, KD, C, s.qc);
  kda::short_conv_silu_forward(s.kin, ctx.W(kconv), ctx.seg, ctx.b.B, ctx.b.T, KD, C, s.kc);
  kda::short_conv_silu_forward(s.vin, ctx.W(vconv), ctx.seg, ctx.b.B, ctx.b.T, VD, C, s.vc);
  kda::l2norm_forward(s.qc, ctx.N * H, Dk, static_cast<T>(kda::kL2NormEps), s.qn);
  kda::l2norm_forward(s.kc, ctx.N * H, Dk, static_cast<T>(kda::kL2NormEps), s.kn);
  linear_forward(x, ctx.W(f1), s.flow, ctx.N, ctx.d, R);
  linear_forward(s.flow, ctx.W(f2), s.f, ctx.N, R, KD);
  kda::kda_gate_forward(s.f, ctx.W(A_log), ctx.W(dt_bias), ctx.N, H, Dk, s.g);
  linear_forward(x, ctx.W(bproj), s.blog, ctx.N, ctx.d, H);
  kda::kda_beta_forward(s.blog, ctx.N * H, ctx.c.linear_allow_neg_eigval, s.beta);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(Dk)));
  if (ctx.kda_recurrent)
    kda::kda_recurrent_forward(s.qn, s.kn, s.vc, s.g, s.beta, ctx.seg, kd, scale, s.o);
  else
    kda::kda_chunk_forward(s.qn, s.kn, s.vc, s.g, s.beta, ctx.seg, kd, scale, s.o, ctx.kda_chunk, s.vn);
  linear_forward(x, ctx.W(g1), s.glow, ctx.N, ctx.d, R);
  linear_forward(s.glow, ctx.W(g2), s.zg, ctx.N, R, VD);
  const T* bias = ctx.W(g2b);
  for (int64_t i = 0; i < ctx.N; ++i) add_into(s.zg + i * VD, bias, VD);
  kda::kda_output_norm_forward(s.o, s.zg, ctx.W(onorm), ctx.N * H, Dv, static_cast<T>(ctx.c.linear_norm_eps),
                               s.y);
  linear_forward(s.y, ctx.W(o), a, ctx.N, VD, ctx.d);
}

template <typename T>
void KdaUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx,
                       const Scratch<T>& w) const {
  const auto kd = delta_rule_dims(ctx, ctx.c.linear_num_key_heads);
  const int64_t H = kd.H, Dk = kd.K, Dv = kd.V, KD = H * Dk, VD = H * Dv, R = ctx.c.linear_value_head_dim,
                C = ctx.c.linear_conv_kernel_dim;
  // A stand-in for an absent parameter gradient: zeroed scratch, discarded.
  auto grad_or = [](T* g, T* stand_in, int64_t n) {
    if (g != nullptr) return g;
    std::fill(stand_in, stand_in + n, T(0));
    return stand_in;
  };
  linear_backward(da, s.y, ctx.W(o), w.dy, ctx.G(o), ctx.N, VD, ctx.d);
  kda::kda_output_norm_backward(s.o, s.zg, ctx.W(onorm), w.dy, ctx.N * H, Dv,
                                static_cast<T>(ctx.c.linear_norm_eps), w.dO, w.dzg,
                                grad_or(ctx.G(onorm), w.donorm, Dv));
  if (T* db = ctx.G(g2b))
    for (int64_t i = 0; i < ctx.N; ++i) add_into(db, w.dzg + i * VD, VD);
  linear_backward(w.dzg, s.glow, ctx.W(g2), w.dglow, ctx.G(g2), ctx.N, R, VD);
  linear_backward(w.dglow, x, ctx.W(g1), dx, ctx.G(g1), ctx.N, ctx.d, R, true);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(Dk)));
  if (ctx.kda_recurrent)
    kda::kda_recurrent_backward(s.qn, s.kn, s.vc, s.g, s.beta, ctx.seg, kd, scale, w.dO, w.dq, w.dk, w.dv,
                                w.dg, w.dbeta);
  else
    kda::kda_chunk_backward(s.qn, s.kn, s.vc, s.g, s.beta, ctx.seg, kd, scale, w.dO, w.dq, w.dk, w.dv, w.dg,
                            w.dbeta, ctx.kda_chunk, s.vn);
  kda::kda_beta_backward(s.blog, w.dbeta, ctx.N * H, ctx.c.linear_allow_neg_eigval, w.dblog);
  linear_backward(w.dblog, x, ctx.W(bproj), dx, ctx.G(bproj), ctx.N, ctx.d, H, true);
  T* dA = ctx.G(A_log);
  T* ddt = ctx.G(dt_bias);
  if (dA == nullptr) {
    dA = grad_or(nullptr, w.dA, H);
    ddt = grad_or(nullptr, w.ddt, KD);
  }
  kda::kda_gate_backward(s.f, ctx.W(A_log), ctx.W(dt_bias), w.dg, ctx.N, H, Dk, w.df, dA, ddt);
  linear_backward(w.df, s.flow, ctx.W(f2), w.dflow, ctx.G(f2), ctx.N, R, KD);
  linear_backward(w.dflow, x, ctx.W(f1), dx, ctx.G(f1), ctx.N, ctx.d, R, true);
  // q, k, v: l2norm, conv + SiLU, projection.
  auto conv_grad = [&](int idx, int64_t CC) { return grad_or(ctx.G(idx), w.dconv, CC * C); };
  kda::l2norm_backward(s.qc, w.dq, ctx.N * H, Dk, static_cast<T>(kda::kL2NormEps), w.dc);
  kda::short_conv_silu_backward(s.qin, ctx.W(qconv), ctx.seg, ctx.b.B, ctx.b.T, KD, C, w.dc, w.din,
                                conv_grad(qconv, KD));
  linear_backward(w.din, x, ctx.W(q), dx, ctx.G(q), ctx.N, ctx.d, KD, true);
  kda::l2norm_backward(s.kc, w.dk, ctx.N * H, Dk, static_cast<T>(kda::kL2NormEps), w.dc);
  kda::short_conv_silu_backward(s.kin, ctx.W(kconv), ctx.seg, ctx.b.B, ctx.b.T, KD, C, w.dc, w.din,
                                conv_grad(kconv, KD));
  linear_backward(w.din, x, ctx.W(k), dx, ctx.G(k), ctx.N, ctx.d, KD, true);
  kda::short_conv_silu_backward(s.vin, ctx.W(vconv), ctx.seg, ctx.b.B, ctx.b.T, VD, C, w.dv, w.din,
                                conv_grad(vconv, VD));
  linear_backward(w.din, x, ctx.W(v), dx, ctx.G(v), ctx.N, ctx.d, VD, true);
}

// ---- XLA: the same unit as StableHLO (unit_emit.h) -----------------------------------------------------

using namespace delta_emit;
using xla::Value;

xla::Value KdaUnit::emit_forward(Emit& e, const xla::Value& x, Emitted& s) const {
  namespace ops = xla::ops;
  auto& b = e.b;
  const ModelConfig& c = e.c;
  const int64_t N = e.N, H = c.linear_num_key_heads, Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
  const Rows r = rows_of(e.mesh, e.B, e.T);
  const DocMasks m = doc_masks(b, seg_rows(b, r, *e.seg), c.linear_conv_kernel_dim);
  s.qin = ops::linear_forward(b, x, e.W(q), e.operands);
  s.kin = ops::linear_forward(b, x, e.W(k), e.operands);
  s.vin = ops::linear_forward(b, x, e.W(v), e.operands);
  s.qc = conv_forward(b, *s.qin, e.W(qconv), m, r);
  s.kc = conv_forward(b, *s.kin, e.W(kconv), m, r);
  s.vc = conv_forward(b, *s.vin, e.W(vconv), m, r);
  s.qn = l2norm_forward(b, *s.qc, H, Dk);
  s.kn = l2norm_forward(b, *s.kc, H, Dk);
  s.flow = ops::linear_forward(b, x, e.W(f1), e.operands);
  s.f = ops::linear_forward(b, *s.flow, e.W(f2), e.operands);
  s.g = gate_forward(b, *s.f, e.W(A_log), e.W(dt_bias), H, Dk);
  s.blog = ops::linear_forward(b, x, e.W(bproj), e.operands);
  const Value beta = b.mul(b.logistic(*s.blog), full(b, {N, H}, c.linear_allow_neg_eigval ? 2.0 : 1.0));
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dk));
  const DeltaInputs in = delta_inputs(b, m, *s.qn, *s.kn, *s.vc, *s.g, beta, r, H, Dk, Dv, scale);
  s.o = delta_rule_forward(b, in, e.delta_chunk);
  s.glow = ops::linear_forward(b, x, e.W(g1), e.operands);
  s.zg = b.add(ops::linear_forward(b, *s.glow, e.W(g2), e.operands), bc(b, e.W(g2b), {N, H * Dv}, {1}));
  s.y = b.reshape(out_norm_forward(b, b.reshape(*s.o, {N, H, Dv}), b.reshape(*s.zg, {N, H, Dv}), e.W(onorm),
                                   c.linear_norm_eps, false),
                  {N, H * Dv});
  return ops::linear_forward(b, *s.y, e.W(o), e.operands);
}

xla::Value KdaUnit::emit_backward(Emit& e, const xla::Value& x, const Emitted& s,
                                  const xla::Value& da) const {
  namespace ops = xla::ops;
  auto& b = e.b;
  const ModelConfig& c = e.c;
  const int64_t N = e.N, H = c.linear_num_key_heads, Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim;
  const Rows r = rows_of(e.mesh, e.B, e.T);
  const DocMasks m = doc_masks(b, seg_rows(b, r, *e.seg), c.linear_conv_kernel_dim);
  std::vector<Value> dxs;  // the terms of dx
  // a = y Wo^T;  y = o_norm(o, zg);  zg = g_proj_2(g_proj_1(x)) + bias
  const ops::LinearBackward lo = ops::linear_backward(b, da, *s.y, e.W(o), e.operands);
  e.grad(o, lo.dw);
  const OutNormBackward on =
      out_norm_backward(b, b.reshape(*s.o, {N, H, Dv}), b.reshape(*s.zg, {N, H, Dv}), e.W(onorm),
                        b.reshape(lo.dx, {N, H, Dv}), c.linear_norm_eps, false);
  e.grad(onorm, on.dw);
  const Value dzg = b.reshape(on.dz, {N, H * Dv});
  e.grad(g2b, b.reduce_sum(dzg, {0}));
  const ops::LinearBackward lg2 = ops::linear_backward(b, dzg, *s.glow, e.W(g2), e.operands);
  e.grad(g2, lg2.dw);
  const ops::LinearBackward lg1 = ops::linear_backward(b, lg2.dx, x, e.W(g1), e.operands);
  e.grad(g1, lg1.dw);
  dxs.push_back(lg1.dx);
  // the delta rule (recomputing beta from its logits)
  const double mb = c.linear_allow_neg_eigval ? 2.0 : 1.0, scale = 1.0 / std::sqrt(static_cast<double>(Dk));
  const Value sb = b.logistic(*s.blog), beta = b.mul(sb, full(b, {N, H}, mb));
  const DeltaInputs in = delta_inputs(b, m, *s.qn, *s.kn, *s.vc, *s.g, beta, r, H, Dk, Dv, scale);
  const Value dO = b.reshape(on.dout, {N, H * Dv});
  const DeltaGrads dd = delta_rule_backward(b, in, m, dO, scale, e.delta_chunk, emit_checkpoint);
  // beta = mb sigmoid(blog):  dblog = dbeta mb s (1 - s)
  const Value dblog = b.mul(b.mul(dd.dbeta, full(b, {N, H}, mb)), b.mul(sb, b.sub(full(b, {N, H}, 1.0), sb)));
  const ops::LinearBackward lb = ops::linear_backward(b, dblog, x, e.W(bproj), e.operands);
  e.grad(bproj, lb.dw);
  dxs.push_back(lb.dx);
  // g = a softplus(f + dt_bias), a = -exp(A_log):  df = dg a softplus'(f + dt_bias);  ddt_bias = sum df;
  // dA_log = sum dg g
  const std::vector<int64_t> d3{N, H, Dk};
  const Value dg = b.reshape(dd.dg, d3), a = bc(b, b.neg(b.exp(e.W(A_log))), d3, {1});
  const Value xx = b.add(b.reshape(*s.f, d3), bc(b, b.reshape(e.W(dt_bias), {H, Dk}), d3, {1, 2}));
  const Value spg =
      b.select(b.compare(xx, full(b, d3, 20.0), xla::Compare::kGt), full(b, d3, 1.0), b.logistic(xx));
  const Value df = b.mul(b.mul(dg, a), spg);
  e.grad(A_log, b.reduce_sum(b.mul(dg, *s.g), {0, 2}));
  e.grad(dt_bias, b.reshape(b.reduce_sum(df, {0}), {H * Dk}));
  const ops::LinearBackward lf2 =
      ops::linear_backward(b, b.reshape(df, {N, H * Dk}), *s.flow, e.W(f2), e.operands);
  e.grad(f2, lf2.dw);
  const ops::LinearBackward lf1 = ops::linear_backward(b, lf2.dx, x, e.W(f1), e.operands);
  e.grad(f1, lf1.dw);
  dxs.push_back(lf1.dx);
  // q, k, v: L2 norm (q, k), conv + SiLU, projection
  auto qkv = [&](const Value& dout, const Value& in_, int conv, int proj) {
    const ConvBackward cb = conv_backward(b, in_, e.W(conv), m, dout, r);
    e.grad(conv, cb.dw);
    const ops::LinearBackward l = ops::linear_backward(b, cb.dx, x, e.W(proj), e.operands);
    e.grad(proj, l.dw);
    dxs.push_back(l.dx);
  };
  qkv(l2norm_backward(b, *s.qc, dd.dq, H, Dk), *s.qin, qconv, q);
  qkv(l2norm_backward(b, *s.kc, dd.dk, H, Dk), *s.kin, kconv, k);
  qkv(dd.dv, *s.vin, vconv, v);
  Value dx = dxs[0];
  for (size_t i = 1; i < dxs.size(); ++i) dx = b.add(dx, dxs[i]);
  return dx;
}

OLMOSFT_MIXER_UNIT(KdaUnit, float)
OLMOSFT_MIXER_UNIT(KdaUnit, double)

}  // namespace olmosft::model::unit
