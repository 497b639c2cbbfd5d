// Softmax attention unit of the hybrid (see unit_attention.h).
#include "model/unit_attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "model/params.h"

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

}  // namespace

SoftmaxAttentionUnit SoftmaxAttentionUnit::resolve(const ParamIndex& idx, const std::string& a,
                                                   const ModelConfig& c, LayerType type) {
  SoftmaxAttentionUnit u;
  resolve_attention(idx, a, &u.q, &u.k, &u.v, &u.o, &u.qnorm, &u.knorm);
  u.gate = idx.get(a + hf::kGProj, false);
  u.ssmax_scale = idx.get(a + hf::kSsmaxScale, false);
  u.window = type == LayerType::SlidingAttention ? c.sliding_window : 0;
  return u;
}

int64_t SoftmaxAttentionUnit::saved_floats_per_token(const ModelConfig& c) {
  const int64_t H = c.num_attention_heads, QD = H * c.head_dim, KVD = c.num_key_value_heads * c.head_dim;
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(c, true, &Gq, &Lq);
  qk_norm_shape(c, false, &Gk, &Lk);
  // q qn o: QD; k v kn: KVD; q/k rstd; lse: H; with SSMax the scaled q, with a gate its logits and o*gate.
  int64_t n = 3 * QD + 3 * KVD + Gq + Gk + H;
  if (c.scalable_softmax) n += QD;
  if (c.attention_gate_type == "elementwise") n += 2 * QD;
  return n;
}

template <typename T>
void SoftmaxAttentionUnit::Saved<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const int64_t H = c.num_attention_heads, QD = H * c.head_dim, KVD = c.num_key_value_heads * c.head_dim;
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(c, true, &Gq, &Lq);
  qk_norm_shape(c, false, &Gk, &Lk);
  // q, k, v and o stay fp32 even under saved_dtype bf16: the backward recomputes the probabilities from q, k
  // and the forward's fp32 logsumexp, which rounded q, k would not match (measured: the SSMax gain's
  // gradient moved by 30%)
  for (T** b : {&q, &qn, &o}) p.add(b, N * QD);
  for (T** b : {&k, &v, &kn}) p.add(b, N * KVD);
  p.add(&qrs, N * Gq);
  p.add(&krs, N * Gk);
  p.add(&lse, N * H);
  if (c.scalable_softmax) p.add(&qs, N * QD);
  if (c.attention_gate_type == "elementwise")
    for (T** b : {&zg, &og}) p.add_activation(b, N * QD);
}

template <typename T>
int64_t SoftmaxAttentionUnit::Scratch<T>::per_token(const ModelConfig& c) {
  // dog dO dz dqs dqn dq: H*D; dkn dv dk: Hkv*D.
  return 6 * c.num_attention_heads * c.head_dim + 3 * c.num_key_value_heads * c.head_dim;
}

template <typename T>
void SoftmaxAttentionUnit::Scratch<T>::plan(Plan& p, const ModelConfig& c, int64_t N) {
  const int64_t H = c.num_attention_heads, QD = H * c.head_dim, KVD = c.num_key_value_heads * c.head_dim;
  for (T** b : {&dog, &dO, &dz, &dqs, &dqn, &dq}) p.add(b, N * QD);
  for (T** b : {&dkn, &dv, &dk}) p.add(b, N * KVD);
  p.add(&acc, std::max(QD, KVD));  // >= every norm's G * L and H
}

template <typename T>
void SoftmaxAttentionUnit::forward(const Ctx<T>& ctx, const T* x, T* a, const Saved<T>& s) const {
  const auto ac = attention_config(ctx.c, ctx.b.B, ctx.b.T, window);
  const int64_t H = ac.heads, Hkv = ac.kv_heads, D = ac.head_dim, QD = H * D, KVD = Hkv * D, N = ctx.N;
  OLMO_CHECK(
      (ssmax_scale < 0 || s.qs != nullptr) && (gate < 0 || s.og != nullptr),
      "attention unit: the workspace plan has no SSMax / gate buffers (config and parameters disagree)");
  linear_forward(x, ctx.W(q), s.q, N, ctx.d, QD);
  linear_forward(x, ctx.W(k), s.k, N, ctx.d, KVD);
  linear_forward(x, ctx.W(v), s.v, N, ctx.d, KVD);
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(ctx.c, true, &Gq, &Lq);
  qk_norm_shape(ctx.c, false, &Gk, &Lk);
  rmsnorm_forward_grouped(s.q, ctx.W(qnorm), Gq, s.qn, s.qrs, N * Gq, Lq, ctx.c.rms_norm_eps);
  rmsnorm_forward_grouped(s.k, ctx.W(knorm), Gk, s.kn, s.krs, N * Gk, Lk, ctx.c.rms_norm_eps);
  const T* qs_in = s.qn;
  if (ssmax_scale >= 0) {
    const T* sc = ctx.W(ssmax_scale);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t hh = 0; hh < H; ++hh) {
        const T f = ctx.logpos[i] * sc[hh];
        for (int64_t j = 0; j < D; ++j) s.qs[(i * H + hh) * D + j] = s.qn[(i * H + hh) * D + j] * f;
      }
    qs_in = s.qs;
  }
  Vec<T> ws(attention_forward_workspace_bytes<T>(ac) / sizeof(T) + 16);
  attention_forward(ac, qs_in, s.kn, s.v, ctx.seg, s.o, s.lse, ws.data(), ws.size() * sizeof(T));
  const T* og = s.o;
  if (gate >= 0) {
    linear_forward(x, ctx.W(gate), s.zg, N, ctx.d, QD);
    for (int64_t i = 0; i < N * QD; ++i) s.og[i] = s.o[i] * sigmoid(s.zg[i]);
    og = s.og;
  }
  linear_forward(og, ctx.W(o), a, N, QD, ctx.d);
}

template <typename T>
void SoftmaxAttentionUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx,
                                    const Scratch<T>& w) const {
  const auto ac = attention_config(ctx.c, ctx.b.B, ctx.b.T, window);
  const int64_t H = ac.heads, Hkv = ac.kv_heads, D = ac.head_dim, QD = H * D, KVD = Hkv * D, N = ctx.N;
  const T* og = gate >= 0 ? s.og : s.o;
  linear_backward(da, og, ctx.W(o), w.dog, ctx.G(o), N, QD, ctx.d);
  bool dx_written = false;
  if (gate >= 0) {
    for (int64_t i = 0; i < N * QD; ++i) {
      const T sg = sigmoid(s.zg[i]);
      w.dO[i] = w.dog[i] * sg;
      w.dz[i] = w.dog[i] * s.o[i] * sg * (T(1) - sg);
    }
    linear_backward(w.dz, x, ctx.W(gate), dx, ctx.G(gate), N, ctx.d, QD, false);
    dx_written = true;
  } else {
    std::copy(w.dog, w.dog + N * QD, w.dO);
  }
  const T* qs_in = ssmax_scale >= 0 ? s.qs : s.qn;
  Vec<T> ws(attention_backward_workspace_bytes<T>(ac) / sizeof(T) + 16);
  attention_backward(ac, qs_in, s.kn, s.v, ctx.seg, s.o, s.lse, w.dO, w.dqs, w.dkn, w.dv, ws.data(),
                     ws.size() * sizeof(T));
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
          dot += static_cast<double>(w.dqs[base + j]) * s.qn[base + j];
          w.dqn[base + j] = static_cast<T>(w.dqs[base + j] * lpv * sc[hh]);
        }
        ds[hh] += lpv * dot;
      }
    if (T* gs = ctx.G(ssmax_scale))
      for (int64_t hh = 0; hh < H; ++hh) gs[hh] += static_cast<T>(ds[hh]);
  } else {
    std::copy(w.dqs, w.dqs + N * QD, w.dqn);
  }
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(ctx.c, true, &Gq, &Lq);
  qk_norm_shape(ctx.c, false, &Gk, &Lk);
  rmsnorm_backward_grouped(w.dqn, s.q, ctx.W(qnorm), Gq, s.qrs, w.dq, ctx.G(qnorm), N * Gq, Lq,
                           ctx.c.rms_norm_eps);
  rmsnorm_backward_grouped(w.dkn, s.k, ctx.W(knorm), Gk, s.krs, w.dk, ctx.G(knorm), N * Gk, Lk,
                           ctx.c.rms_norm_eps);
  linear_backward(w.dq, x, ctx.W(q), dx, ctx.G(q), N, ctx.d, QD, dx_written);
  linear_backward(w.dk, x, ctx.W(k), dx, ctx.G(k), N, ctx.d, KVD, true);
  linear_backward(w.dv, x, ctx.W(v), dx, ctx.G(v), N, ctx.d, KVD, true);
}

OLMOSFT_MIXER_UNIT(SoftmaxAttentionUnit, float)
OLMOSFT_MIXER_UNIT(SoftmaxAttentionUnit, double)

}  // namespace olmosft::model::unit
