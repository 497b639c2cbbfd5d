// Embedding unit (see unit_embedding.h).
#include "model/unit_embedding.h"

#include <algorithm>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/rmsnorm.h"
#include "model/params.h"

namespace olmosft::model::unit {

void EmbeddingUnit::params(Params& p, const ModelConfig& c) {
  p.add(embed, hf::kEmbedTokens, {c.vocab_size, c.hidden_size});
  if (c.is_moe() && c.embed_norm) p.add(embed_norm, hf::kEmbedNorm, {c.hidden_size});
}

template <typename T>
void EmbeddingUnit::forward(const Ctx<T>& ctx, T* h, const Saved<T>& s) const {
  const int64_t N = ctx.N, d = ctx.d;
  const T* E = ctx.W(embed);
  OLMO_CHECK(embed_norm < 0 || s.e != nullptr,
             "embedding unit: the workspace plan has no embed_norm buffers");
  T* out = embed_norm >= 0 ? s.e : h;
  const double scale = ctx.c.embed_scale;
  parallel_for(
      N,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const T* row = E + static_cast<int64_t>(ctx.b.tokens[i]) * d;
          for (int64_t j = 0; j < d; ++j) out[i * d + j] = static_cast<T>(row[j] * scale);
        }
      },
      64);
  if (embed_norm >= 0) rmsnorm_forward(s.e, ctx.W(embed_norm), h, s.rs, N, d, ctx.c.rms_norm_eps);
}

template <typename T>
void EmbeddingUnit::backward(const Ctx<T>& ctx, const T* dh, const Saved<T>& s, T* de) const {
  const int64_t N = ctx.N, d = ctx.d;
  const T* g = dh;
  if (embed_norm >= 0) {
    rmsnorm_backward(dh, s.e, ctx.W(embed_norm), s.rs, de, ctx.G(embed_norm), N, d, ctx.c.rms_norm_eps);
    g = de;
  }
  T* dE = ctx.G(embed);
  if (dE == nullptr) return;
  const double scale = ctx.c.embed_scale;
  // dE[tok] += scale * g: columns split across threads, so each element sums its tokens in order.
  parallel_for(
      d,
      [&](int64_t c0, int64_t c1) {
        for (int64_t i = 0; i < N; ++i) {
          T* dst = dE + static_cast<int64_t>(ctx.b.tokens[i]) * d;
          const T* src = g + i * d;
          for (int64_t c = c0; c < c1; ++c) dst[c] += static_cast<T>(src[c] * scale);
        }
      },
      16);
}

xla::Value EmbeddingUnit::emit_forward(Emit& e, Emitted& s) const {
  auto& b = e.b;
  xla::Value rows = b.gather_rows(e.W(embed), *e.tokens);
  // row * f32(scale) in f32; the CPU rounds row * (double) scale once: equal when the scale is a float
  if (e.c.embed_scale != 1.0) rows = b.mul(rows, b.constant(rows.type(), e.c.embed_scale));
  if (embed_norm < 0) return rows;
  const xla::ops::RmsNormForward n = xla::ops::rmsnorm_forward(b, rows, e.W(embed_norm), e.c.rms_norm_eps);
  s.e = rows;
  s.rs = n.rstd;
  return n.y;
}

void EmbeddingUnit::emit_backward(Emit& e, const Emitted& s, const xla::Value& dh) const {
  auto& b = e.b;
  xla::Value g = dh;
  if (embed_norm >= 0) {
    const xla::ops::RmsNormBackward r = xla::ops::rmsnorm_backward(b, dh, *s.e, e.W(embed_norm), *s.rs);
    e.grad(embed_norm, *r.dw);
    g = r.dx;
  }
  if (e.c.embed_scale != 1.0) g = b.mul(g, b.constant(g.type(), e.c.embed_scale));
  const xla::Value& E = e.W(embed);
  e.grad(embed, b.scatter_add_rows(b.constant(E.type(), 0.0), *e.tokens, g));
}

#define OLMOSFT_EMBEDDING_UNIT(T)                                                    \
  template void EmbeddingUnit::forward<T>(const Ctx<T>&, T*, const Saved<T>&) const; \
  template void EmbeddingUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, T*) const;
OLMOSFT_EMBEDDING_UNIT(float)
OLMOSFT_EMBEDDING_UNIT(double)
#undef OLMOSFT_EMBEDDING_UNIT

}  // namespace olmosft::model::unit
