// Softmax attention unit of the hybrid (see unit_attention.h).
#include "model/unit_attention.h"

#include <cmath>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "model/params.h"

namespace olmosft::model::unit {

namespace {

// Grouped RMSNorm: N*G rows of length L; row r uses gain w + (r % G) * L (w holds G*L gains). Used for
// the attention q/k norms (per head: G = heads, L = head_dim; whole vector: G = 1, L = heads*head_dim).
template <typename T>
void group_rms_forward(const T* x, const T* w, int64_t rows, int64_t G, int64_t L, double eps, T* y,
                       T* rstd) {
#pragma omp parallel for schedule(static) if (rows * L >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * L;
    double ss = 0;
    for (int64_t i = 0; i < L; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(L) + eps);
    rstd[r] = static_cast<T>(rs);
    const T* wr = w + (r % G) * L;
    for (int64_t i = 0; i < L; ++i) y[r * L + i] = static_cast<T>(static_cast<double>(xr[i]) * rs * wr[i]);
  }
}

template <typename T>
void group_rms_backward(const T* x, const T* w, const T* rstd, const T* dy, int64_t rows, int64_t G,
                        int64_t L, T* dx, T* dw) {
  Vec<double> dwacc(static_cast<size_t>(G * L), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * L;
    const T* dyr = dy + r * L;
    const T* wr = w + (r % G) * L;
    const double rs = rstd[r];
    double m = 0;
    for (int64_t i = 0; i < L; ++i) m += static_cast<double>(xr[i]) * wr[i] * dyr[i];
    m /= static_cast<double>(L);
    double* dwr = dwacc.data() + (r % G) * L;
    for (int64_t i = 0; i < L; ++i) {
      const double gi = static_cast<double>(wr[i]) * dyr[i];
      dx[r * L + i] = static_cast<T>(rs * (gi - static_cast<double>(xr[i]) * rs * rs * m));
      dwr[i] += static_cast<double>(dyr[i]) * xr[i] * rs;
    }
  }
  if (dw != nullptr)
    for (int64_t i = 0; i < G * L; ++i) dw[i] += static_cast<T>(dwacc[static_cast<size_t>(i)]);
}

template <typename T>
T sigmoid(T x) {
  return static_cast<T>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
}

template <typename T>
AttentionConfig attention_config(const Ctx<T>& ctx, int64_t window) {
  AttentionConfig ac;
  ac.batch = ctx.b.B;
  ac.seq = ctx.b.T;
  ac.heads = ctx.c.num_attention_heads;
  ac.kv_heads = ctx.c.num_key_value_heads;
  ac.head_dim = ctx.c.head_dim;
  ac.v_head_dim = ctx.c.head_dim;
  ac.window = window;
  ac.scale = 1.0 / std::sqrt(static_cast<double>(ctx.c.head_dim));
  return ac;
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
size_t SoftmaxAttentionUnit::Saved<T>::bytes() const {
  size_t n = 0;
  for (const Vec<T>* v : {&q, &k, &v, &qn, &kn, &qrs, &krs, &qs, &o, &lse, &zg, &og}) n += vec_bytes(*v);
  return n;
}

template <typename T>
void SoftmaxAttentionUnit::forward(const Ctx<T>& ctx, const T* x, T* a, Saved<T>& s) const {
  const auto ac = attention_config(ctx, window);
  const int64_t H = ac.heads, Hkv = ac.kv_heads, D = ac.head_dim, QD = H * D, KVD = Hkv * D;
  s.q.resize(static_cast<size_t>(ctx.N * QD));
  s.k.resize(static_cast<size_t>(ctx.N * KVD));
  s.v.resize(s.k.size());
  linear_forward(x, ctx.W(q), s.q.data(), ctx.N, ctx.d, QD);
  linear_forward(x, ctx.W(k), s.k.data(), ctx.N, ctx.d, KVD);
  linear_forward(x, ctx.W(v), s.v.data(), ctx.N, ctx.d, KVD);
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(ctx.c, true, &Gq, &Lq);
  qk_norm_shape(ctx.c, false, &Gk, &Lk);
  s.qn.resize(s.q.size());
  s.kn.resize(s.k.size());
  s.qrs.resize(static_cast<size_t>(ctx.N * Gq));
  s.krs.resize(static_cast<size_t>(ctx.N * Gk));
  group_rms_forward(s.q.data(), ctx.W(qnorm), ctx.N * Gq, Gq, Lq, ctx.c.rms_norm_eps, s.qn.data(),
                    s.qrs.data());
  group_rms_forward(s.k.data(), ctx.W(knorm), ctx.N * Gk, Gk, Lk, ctx.c.rms_norm_eps, s.kn.data(),
                    s.krs.data());
  const T* qs_in = s.qn.data();
  if (ssmax_scale >= 0) {
    s.qs.resize(s.qn.size());
    const T* sc = ctx.W(ssmax_scale);
    for (int64_t i = 0; i < ctx.N; ++i)
      for (int64_t hh = 0; hh < H; ++hh) {
        const T f = ctx.logpos[i] * sc[hh];
        for (int64_t j = 0; j < D; ++j)
          s.qs[static_cast<size_t>((i * H + hh) * D + j)] =
              s.qn[static_cast<size_t>((i * H + hh) * D + j)] * f;
      }
    qs_in = s.qs.data();
  }
  s.o.resize(s.q.size());
  s.lse.resize(static_cast<size_t>(ctx.N * H));
  Vec<T> ws(attention_forward_workspace_bytes<T>(ac) / sizeof(T) + 16);
  attention_forward(ac, qs_in, s.kn.data(), s.v.data(), ctx.seg, s.o.data(), s.lse.data(), ws.data(),
                    ws.size() * sizeof(T));
  const T* og = s.o.data();
  if (gate >= 0) {
    s.zg.resize(s.o.size());
    linear_forward(x, ctx.W(gate), s.zg.data(), ctx.N, ctx.d, QD);
    s.og.resize(s.o.size());
    for (size_t i = 0; i < s.o.size(); ++i) s.og[i] = s.o[i] * sigmoid(s.zg[i]);
    og = s.og.data();
  }
  linear_forward(og, ctx.W(o), a, ctx.N, QD, ctx.d);
}

template <typename T>
void SoftmaxAttentionUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da,
                                    T* dx) const {
  const auto ac = attention_config(ctx, window);
  const int64_t H = ac.heads, Hkv = ac.kv_heads, D = ac.head_dim, QD = H * D, KVD = Hkv * D;
  Vec<T> dog(s.o.size());
  const T* og = gate >= 0 ? s.og.data() : s.o.data();
  linear_backward(da, og, ctx.W(o), dog.data(), ctx.G(o), ctx.N, QD, ctx.d);
  Vec<T> dO(s.o.size());
  bool dx_written = false;
  if (gate >= 0) {
    Vec<T> dz(s.o.size());
    for (size_t i = 0; i < s.o.size(); ++i) {
      const T sg = sigmoid(s.zg[i]);
      dO[i] = dog[i] * sg;
      dz[i] = dog[i] * s.o[i] * sg * (T(1) - sg);
    }
    linear_backward(dz.data(), x, ctx.W(gate), dx, ctx.G(gate), ctx.N, ctx.d, QD, false);
    dx_written = true;
  } else {
    dO = dog;
  }
  Vec<T> dqs(s.q.size()), dkn(s.k.size()), dv(s.v.size());
  const T* qs_in = ssmax_scale >= 0 ? s.qs.data() : s.qn.data();
  Vec<T> ws(attention_backward_workspace_bytes<T>(ac) / sizeof(T) + 16);
  attention_backward(ac, qs_in, s.kn.data(), s.v.data(), ctx.seg, s.o.data(), s.lse.data(), dO.data(),
                     dqs.data(), dkn.data(), dv.data(), ws.data(), ws.size() * sizeof(T));
  Vec<T> dqn(s.q.size());
  if (ssmax_scale >= 0) {
    const T* sc = ctx.W(ssmax_scale);
    Vec<double> ds(static_cast<size_t>(H), 0.0);
    for (int64_t i = 0; i < ctx.N; ++i)
      for (int64_t hh = 0; hh < H; ++hh) {
        const double lpv = ctx.logpos[i];
        double dot = 0;
        const size_t base = static_cast<size_t>((i * H + hh) * D);
        for (int64_t j = 0; j < D; ++j) {
          dot += static_cast<double>(dqs[base + j]) * s.qn[base + j];
          dqn[base + j] = static_cast<T>(dqs[base + j] * lpv * sc[hh]);
        }
        ds[static_cast<size_t>(hh)] += lpv * dot;
      }
    if (T* gs = ctx.G(ssmax_scale))
      for (int64_t hh = 0; hh < H; ++hh) gs[hh] += static_cast<T>(ds[static_cast<size_t>(hh)]);
  } else {
    dqn = dqs;
  }
  int64_t Gq, Lq, Gk, Lk;
  qk_norm_shape(ctx.c, true, &Gq, &Lq);
  qk_norm_shape(ctx.c, false, &Gk, &Lk);
  Vec<T> dq(s.q.size()), dk(s.k.size());
  group_rms_backward(s.q.data(), ctx.W(qnorm), s.qrs.data(), dqn.data(), ctx.N * Gq, Gq, Lq, dq.data(),
                     ctx.G(qnorm));
  group_rms_backward(s.k.data(), ctx.W(knorm), s.krs.data(), dkn.data(), ctx.N * Gk, Gk, Lk, dk.data(),
                     ctx.G(knorm));
  linear_backward(dq.data(), x, ctx.W(q), dx, ctx.G(q), ctx.N, ctx.d, QD, dx_written);
  linear_backward(dk.data(), x, ctx.W(k), dx, ctx.G(k), ctx.N, ctx.d, KVD, true);
  linear_backward(dv.data(), x, ctx.W(v), dx, ctx.G(v), ctx.N, ctx.d, KVD, true);
}

#define OLMOSFT_ATTN_UNIT(T)                                                                              \
  template struct SoftmaxAttentionUnit::Saved<T>;                                                         \
  template void SoftmaxAttentionUnit::forward<T>(const Ctx<T>&, const T*, T*, Saved<T>&) const;           \
  template void SoftmaxAttentionUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, const T*, T*) \
      const;
OLMOSFT_ATTN_UNIT(float)
OLMOSFT_ATTN_UNIT(double)
#undef OLMOSFT_ATTN_UNIT

}  // namespace olmosft::model::unit
