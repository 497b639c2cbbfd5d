// Softmax attention mixer unit (see unit_attention.h).
#include "model/unit_attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "model/params.h"
#include "xla/ops_attention.h"
#include "xla/ops_attention_cudnn.h"

namespace olmosft::model::unit {

namespace {

template <typename T>
T sigmoid(T x) {
  return static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
}

// q/k norm grouping: per head (G = heads, L = head_dim) or over the whole vector (G = 1).
void qk_norm_shape(const ModelConfig& c, bool is_q, int64_t* G, int64_t* Ls) {
  const int64_t H = is_q ? c.num_attention_heads : c.num_key_value_heads, D = c.head_dim;
  *G = c.use_head_qk_norm ? H : 1;
  *Ls = c.use_head_qk_norm ? D : H * D;
}

bool gated(const ModelConfig& c) { return c.attention_gate_type == "elementwise"; }

}  // namespace

void AttentionUnit::params(Params& p, const ModelConfig& c, const LayerSpec& spec) {
  const std::string a = hf::layer(spec.index) + kPrefix;
  const int64_t d = c.hidden_size, H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  p.add(q, a + hf::kQProj, {H * D, d});
  p.add(k, a + hf::kKProj, {Hkv * D, d});
  p.add(v, a + hf::kVProj, {Hkv * D, d});
  p.add(o, a + hf::kOProj, {d, H * D});
  p.add(qnorm, a + hf::kQNorm, c.qk_norm_per_head_gains ? Shape{H, D} : Shape{H * D});
  p.add(knorm, a + hf::kKNorm, c.qk_norm_per_head_gains ? Shape{Hkv, D} : Shape{Hkv * D});
  if (gated(c)) p.add(gate, a + hf::kGProj, {H * D, d});
  if (c.scalable_softmax) p.add(ssmax_scale, a + hf::kSsmaxScale, {H});
  window = spec.window;
  rope = spec.rope;
}

int64_t AttentionUnit::saved_floats_per_token(const ModelConfig& c) {
  const int64_t H = c.num_attention_heads, QD = H * c.head_dim, KVD = c.num_key_value_heads * c.head_dim;
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(c, true, &Gq, &Lq);
  qk_norm_shape(c, false, &Gk, &Lk);
  // q o: QD; k v: KVD; q/k rstd; lse: H; with a gate its logits and o*gate.
  return 2 * QD + 2 * KVD + Gq + Gk + H + (gated(c) ? 2 * QD : 0);
}

double AttentionUnit::gemm_weights_per_token(const ModelConfig& c) {
  const double d = static_cast<double>(c.hidden_size),
               QD = static_cast<double>(c.num_attention_heads * c.head_dim),
               KVD = static_cast<double>(c.num_key_value_heads * c.head_dim);
  return d * QD + 2 * d * KVD + QD * d + (gated(c) ? d * QD : 0.0);
}

template <typename T>
void AttentionUnit::Saved<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const int64_t H = c.num_attention_heads, QD = H * c.head_dim, KVD = c.num_key_value_heads * c.head_dim;
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(c, true, &Gq, &Lq);
  qk_norm_shape(c, false, &Gk, &Lk);
  // q, k, v and o stay fp32 even under saved_dtype bf16: the backward recomputes the probabilities from q, k
  // and the forward's fp32 logsumexp, which rounded q, k would not match (measured: the SSMax gain's
  // gradient moved by 30%)
  p.add(&q, N * QD);
  p.add(&k, N * KVD);
  p.add(&v, N * KVD);
  p.add(&o, N * QD);
  p.add(&lse, N * H);
  p.add(&qrs, N * Gq);
  p.add(&krs, N * Gk);
  zg = og = nullptr;
  if (gated(c))
    for (T** b : {&zg, &og}) p.add_activation(b, N * QD);
}

template <typename T>
int64_t AttentionUnit::Scratch<T>::per_token(const ModelConfig& c) {
  const int64_t QD = c.num_attention_heads * c.head_dim, KVD = c.num_key_value_heads * c.head_dim;
  // qn dO dq: QD; kn dk dv: KVD; SSMax: qs dqn; gate: dog dz.
  return 3 * QD + 3 * KVD + (c.scalable_softmax ? 2 * QD : 0) + (gated(c) ? 2 * QD : 0);
}

template <typename T>
void AttentionUnit::Scratch<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const int64_t H = c.num_attention_heads, QD = H * c.head_dim, KVD = c.num_key_value_heads * c.head_dim;
  for (T** b : {&qn, &dO, &dq}) p.add(b, N * QD);
  for (T** b : {&kn, &dk, &dv}) p.add(b, N * KVD);
  qs = dqn = dog = dz = nullptr;
  if (c.scalable_softmax)
    for (T** b : {&qs, &dqn}) p.add(b, N * QD);
  if (gated(c))
    for (T** b : {&dog, &dz}) p.add(b, N * QD);
  p.add(&acc, H);
}

template <typename T>
const T* AttentionUnit::normed_qk(const Ctx<T>& ctx, const Saved<T>& s, const Scratch<T>& w,
                                  bool save_rstd) const {
  const ModelConfig& c = ctx.c;
  const int64_t N = ctx.N, H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(c, true, &Gq, &Lq);
  qk_norm_shape(c, false, &Gk, &Lk);
  rmsnorm_forward_grouped(s.q, ctx.W(qnorm), Gq, w.qn, save_rstd ? s.qrs : nullptr, N * Gq, Lq,
                          c.rms_norm_eps);
  rmsnorm_forward_grouped(s.k, ctx.W(knorm), Gk, w.kn, save_rstd ? s.krs : nullptr, N * Gk, Lk,
                          c.rms_norm_eps);
  if (rope != RopeKind::None) {
    const T* cs = ctx.rope_cos[static_cast<int>(rope)];
    const T* sn = ctx.rope_sin[static_cast<int>(rope)];
    rope_forward<T>(w.qn, cs, sn, N, H, D, H * D);
    rope_forward<T>(w.kn, cs, sn, N, Hkv, D, Hkv * D);
  }
  if (ssmax_scale < 0) return w.qn;
  const T* sc = ctx.W(ssmax_scale);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t hh = 0; hh < H; ++hh) {
      const T f = ctx.logpos[i] * sc[hh];
      for (int64_t j = 0; j < D; ++j) w.qs[(i * H + hh) * D + j] = w.qn[(i * H + hh) * D + j] * f;
    }
  return w.qs;
}

template <typename T>
void AttentionUnit::forward(const Ctx<T>& ctx, const T* x, T* a, const Saved<T>& s,
                            const Scratch<T>& w) const {
  const auto ac = attention_config(ctx.c, ctx.b.B, ctx.b.T, window);
  const int64_t QD = ac.heads * ac.head_dim, KVD = ac.kv_heads * ac.head_dim, N = ctx.N;
  OLMO_CHECK(
      (ssmax_scale < 0 || w.qs != nullptr) && (gate < 0 || s.og != nullptr),
      "attention unit: the workspace plan has no SSMax / gate buffers (config and parameters disagree)");
  linear_forward(x, ctx.W(q), s.q, N, ctx.d, QD);
  linear_forward(x, ctx.W(k), s.k, N, ctx.d, KVD);
  linear_forward(x, ctx.W(v), s.v, N, ctx.d, KVD);
  const T* q_in = normed_qk(ctx, s, w, true);
  attention_forward(ac, q_in, w.kn, s.v, ctx.seg, s.o, s.lse, ctx.attn_ws, ctx.attn_ws_bytes);
  const T* og = s.o;
  if (gate >= 0) {
    linear_forward(x, ctx.W(gate), s.zg, N, ctx.d, QD);
    for (int64_t i = 0; i < N * QD; ++i) s.og[i] = s.o[i] * sigmoid(s.zg[i]);
    og = s.og;
  }
  linear_forward(og, ctx.W(o), a, N, QD, ctx.d);
}

template <typename T>
void AttentionUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx,
                             const Scratch<T>& w) const {
  const auto ac = attention_config(ctx.c, ctx.b.B, ctx.b.T, window);
  const int64_t H = ac.heads, Hkv = ac.kv_heads, D = ac.head_dim, QD = H * D, KVD = Hkv * D, N = ctx.N;
  const ModelConfig& c = ctx.c;
  if (gate >= 0) {
    linear_backward(da, s.og, ctx.W(o), w.dog, ctx.G(o), N, QD, ctx.d);
    for (int64_t i = 0; i < N * QD; ++i) {
      const T sg = sigmoid(s.zg[i]);
      w.dO[i] = w.dog[i] * sg;
      w.dz[i] = w.dog[i] * s.o[i] * sg * (T(1) - sg);
    }
    linear_backward(w.dz, x, ctx.W(gate), dx, ctx.G(gate), N, ctx.d, QD, true);
  } else {
    linear_backward(da, s.o, ctx.W(o), w.dO, ctx.G(o), N, QD, ctx.d);
  }
  const T* q_in = normed_qk(ctx, s, w, false);
  attention_backward(ac, q_in, w.kn, s.v, ctx.seg, s.o, s.lse, w.dO, w.dq, w.dk, w.dv, ctx.attn_ws,
                     ctx.attn_ws_bytes);
  T* dqn = w.dq;  // d(normed q): the SSMax product's backward, or the attention's dq itself
  if (ssmax_scale >= 0) {
    const T* sc = ctx.W(ssmax_scale);
    double* ds = w.acc;
    std::fill(ds, ds + H, 0.0);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t hh = 0; hh < H; ++hh) {
        const double lpv = ctx.logpos[i];
        double dot = 0;
        const int64_t base = (i * H + hh) * D;
        for (int64_t j = 0; j < D; ++j) {
          dot += static_cast<double>(w.dq[base + j]) * w.qn[base + j];
          w.dqn[base + j] = static_cast<T>(w.dq[base + j] * lpv * sc[hh]);
        }
        ds[hh] += lpv * dot;
      }
    if (T* gs = ctx.G(ssmax_scale))
      for (int64_t hh = 0; hh < H; ++hh) gs[hh] += static_cast<T>(ds[hh]);
    dqn = w.dqn;
  }
  if (rope != RopeKind::None) {
    const T* cs = ctx.rope_cos[static_cast<int>(rope)];
    const T* sn = ctx.rope_sin[static_cast<int>(rope)];
    rope_backward<T>(dqn, cs, sn, N, H, D, QD);
    rope_backward<T>(w.dk, cs, sn, N, Hkv, D, KVD);
  }
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(c, true, &Gq, &Lq);
  qk_norm_shape(c, false, &Gk, &Lk);
  T* dqraw = w.dO;  // free after the attention backward
  T* dkraw = w.kn;  // free after the attention backward
  rmsnorm_backward_grouped(dqn, s.q, ctx.W(qnorm), Gq, s.qrs, dqraw, ctx.G(qnorm), N * Gq, Lq,
                           c.rms_norm_eps);
  rmsnorm_backward_grouped(w.dk, s.k, ctx.W(knorm), Gk, s.krs, dkraw, ctx.G(knorm), N * Gk, Lk,
                           c.rms_norm_eps);
  linear_backward(dqraw, x, ctx.W(q), dx, ctx.G(q), N, ctx.d, QD, true);
  linear_backward(dkraw, x, ctx.W(k), dx, ctx.G(k), N, ctx.d, KVD, true);
  linear_backward(w.dv, x, ctx.W(v), dx, ctx.G(v), N, ctx.d, KVD, true);
}

// ---- XLA: the same unit as StableHLO (unit_emit.h) -----------------------------------------------------

namespace {

xla::ops::AttentionOptions emit_attention_options(const Emit& e, int64_t window) {
  xla::ops::AttentionOptions o;
  o.scale = attention_config(e.c, e.B, e.T, window).scale;
  o.window = window;
  o.block = e.attention_block;
  o.operands = e.operands;  // compute.dtype bf16: the attention's products too (cuDNN's always are)
  o.mesh = e.mesh;          // rows split over devices: each attends its own queries against whole rows
  return o;
}

const xla::ops::CudnnPacking* cudnn_packing(const Emit& e) {
  return e.cudnn_packed ? &*e.cudnn_packed : nullptr;
}

// The SSMax factor logpos[i] * scale[h] as [N, H] (the CPU's f32 product), broadcast over head_dim.
xla::Value ssmax_factor(Emit& e, const xla::Value& sc, int64_t H, int64_t D) {
  auto& b = e.b;
  const xla::Value f =
      b.mul(b.broadcast_in_dim(*e.logpos, {e.N, H}, {0}), b.broadcast_in_dim(sc, {e.N, H}, {1}));
  return b.broadcast_in_dim(f, {e.N, H, D}, {0, 1});
}

}  // namespace

xla::Value AttentionUnit::emit_forward(Emit& e, const xla::Value& x, Emitted& s) const {
  namespace ops = xla::ops;
  auto& b = e.b;
  const ModelConfig& c = e.c;
  const int64_t N = e.N, H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(c, true, &Gq, &Lq);
  qk_norm_shape(c, false, &Gk, &Lk);
  s.q = ops::linear_forward(b, x, e.W(q), e.operands);
  s.k = ops::linear_forward(b, x, e.W(k), e.operands);
  const xla::Value v_ = ops::linear_forward(b, x, e.W(v), e.operands);
  // the gains flat ([heads, head_dim] per-head gains as one [heads * head_dim] vector)
  const ops::RmsNormForward nq =
      ops::rmsnorm_forward(b, *s.q, b.reshape(e.W(qnorm), {H * D}), c.rms_norm_eps, Gq);
  const ops::RmsNormForward nk =
      ops::rmsnorm_forward(b, *s.k, b.reshape(e.W(knorm), {Hkv * D}), c.rms_norm_eps, Gk);
  s.qrs = nq.rstd;
  s.krs = nk.rstd;
  xla::Value qn = b.reshape(nq.y, {N, H, D}), kn = b.reshape(nk.y, {N, Hkv, D});
  if (rope != RopeKind::None) {
    const ops::RopeTables& t = *e.rope[static_cast<int>(rope)];
    qn = ops::rope_forward(b, qn, t);
    kn = ops::rope_forward(b, kn, t);
  }
  s.qn = qn;
  const xla::Value qin = ssmax_scale < 0 ? qn : b.mul(qn, ssmax_factor(e, e.W(ssmax_scale), H, D));
  s.qin = b.reshape(qin, {e.B, e.T, H, D});
  s.kin = b.reshape(kn, {e.B, e.T, Hkv, D});
  s.vin = b.reshape(v_, {e.B, e.T, Hkv, D});
  const ops::AttentionOptions ao = emit_attention_options(e, window);
  const ops::AttentionForward af =
      e.attention_cudnn ? ops::attention_forward_cudnn(b, *s.qin, *s.kin, *s.vin, ao, cudnn_packing(e))
                        : ops::attention_forward(b, *s.qin, *s.kin, *s.vin, *e.seg, ao);
  s.out = af.out;
  s.lse = af.lse;
  xla::Value og = b.reshape(af.out, {N, H * D});
  if (gate >= 0) {
    s.zg = ops::linear_forward(b, x, e.W(gate), e.operands);
    og = b.mul(og, b.logistic(*s.zg));
    s.og = og;
  }
  return ops::linear_forward(b, og, e.W(o), e.operands);
}

xla::Value AttentionUnit::emit_backward(Emit& e, const xla::Value& x, const Emitted& s,
                                        const xla::Value& da) const {
  namespace ops = xla::ops;
  auto& b = e.b;
  const ModelConfig& c = e.c;
  const int64_t N = e.N, H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const xla::Value o_flat = b.reshape(*s.out, {N, H * D});
  const ops::LinearBackward lo = ops::linear_backward(b, da, gate >= 0 ? *s.og : o_flat, e.W(o), e.operands);
  e.grad(o, lo.dw);
  xla::Value dO = lo.dx;
  std::optional<xla::Value> dx;
  if (gate >= 0) {  // og = o * sigmoid(zg)
    const xla::Value sg = b.logistic(*s.zg), one = b.constant(sg.type(), 1.0);
    dO = b.mul(lo.dx, sg);
    const xla::Value dz = b.mul(b.mul(b.mul(lo.dx, o_flat), sg), b.sub(one, sg));
    const ops::LinearBackward lg = ops::linear_backward(b, dz, x, e.W(gate), e.operands);
    e.grad(gate, lg.dw);
    dx = lg.dx;
  }
  const ops::AttentionOptions ao = emit_attention_options(e, window);
  const xla::Value dout = b.reshape(dO, {e.B, e.T, H, D});
  const ops::AttentionBackward ab =
      e.attention_cudnn
          ? ops::attention_backward_cudnn(b, *s.qin, *s.kin, *s.vin, *s.out, *s.lse, dout, ao,
                                          cudnn_packing(e))
          : ops::attention_backward(b, *s.qin, *s.kin, *s.vin, *e.seg, *s.out, *s.lse, dout, ao);
  xla::Value dqn = b.reshape(ab.dq, {N, H, D}), dkn = b.reshape(ab.dk, {N, Hkv, D});
  if (ssmax_scale >= 0) {                                              // qin = qn * logpos[i] * sc[h]
    const xla::Value per_head = b.reduce_sum(b.mul(dqn, *s.qn), {2});  // [N, H]
    e.grad(ssmax_scale, b.reduce_sum(b.mul(per_head, b.broadcast_in_dim(*e.logpos, {N, H}, {0})), {0}));
    dqn = b.mul(dqn, ssmax_factor(e, e.W(ssmax_scale), H, D));
  }
  if (rope != RopeKind::None) {
    const ops::RopeTables& t = *e.rope[static_cast<int>(rope)];
    dqn = ops::rope_backward(b, dqn, t);
    dkn = ops::rope_backward(b, dkn, t);
  }
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(c, true, &Gq, &Lq);
  qk_norm_shape(c, false, &Gk, &Lk);
  const ops::RmsNormBackward rq =
      ops::rmsnorm_backward(b, b.reshape(dqn, {N, H * D}), *s.q, b.reshape(e.W(qnorm), {H * D}), *s.qrs, Gq);
  const ops::RmsNormBackward rk = ops::rmsnorm_backward(b, b.reshape(dkn, {N, Hkv * D}), *s.k,
                                                        b.reshape(e.W(knorm), {Hkv * D}), *s.krs, Gk);
  e.grad(qnorm, b.reshape(*rq.dw, e.W(qnorm).type().dims));
  e.grad(knorm, b.reshape(*rk.dw, e.W(knorm).type().dims));
  const ops::LinearBackward lq = ops::linear_backward(b, rq.dx, x, e.W(q), e.operands);
  const ops::LinearBackward lk = ops::linear_backward(b, rk.dx, x, e.W(k), e.operands);
  const ops::LinearBackward lv =
      ops::linear_backward(b, b.reshape(ab.dv, {N, Hkv * D}), x, e.W(v), e.operands);
  e.grad(q, lq.dw);
  e.grad(k, lk.dw);
  e.grad(v, lv.dw);
  xla::Value sum = b.add(b.add(lq.dx, lk.dx), lv.dx);
  return dx ? b.add(*dx, sum) : sum;
}

OLMOSFT_MIXER_UNIT(AttentionUnit, float)
OLMOSFT_MIXER_UNIT(AttentionUnit, double)

}  // namespace olmosft::model::unit
