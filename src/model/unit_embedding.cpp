// Embedding unit of the hybrid (see unit_embedding.h).
#include "model/unit_embedding.h"

#include <algorithm>

#include "kernels/rmsnorm.h"
#include "model/params.h"

namespace olmosft::model::unit {

ScaledEmbeddingUnit ScaledEmbeddingUnit::resolve(const ParamIndex& idx) {
  ScaledEmbeddingUnit u;
  u.embed = idx.get(hf::kEmbedTokens);
  u.embed_norm = idx.get(hf::kEmbedNorm, false);
  return u;
}

template <typename T>
void ScaledEmbeddingUnit::forward(const Ctx<T>& ctx, T* h, const Saved<T>& s) const {
  const int64_t N = ctx.N, d = ctx.d;
  const T* E = ctx.W(embed);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < d; ++j)
      s.e[i * d + j] = static_cast<T>(E[ctx.b.tokens[i] * d + j] * ctx.c.embed_scale);
  if (embed_norm >= 0)
    rmsnorm_forward(s.e, ctx.W(embed_norm), h, s.rs, N, d, ctx.c.rms_norm_eps);
  else
    std::copy(s.e, s.e + N * d, h);
}

template <typename T>
void ScaledEmbeddingUnit::backward(const Ctx<T>& ctx, const T* dh, const Saved<T>& s, T* de) const {
  const int64_t N = ctx.N, d = ctx.d;
  if (embed_norm >= 0)
    rmsnorm_backward(dh, s.e, ctx.W(embed_norm), s.rs, de, ctx.G(embed_norm), N, d, ctx.c.rms_norm_eps);
  else
    std::copy(dh, dh + N * d, de);
  if (T* dE = ctx.G(embed)) {
    for (int64_t i = 0; i < N; ++i) {
      T* row = dE + static_cast<int64_t>(ctx.b.tokens[i]) * d;
      for (int64_t j = 0; j < d; ++j) row[j] += static_cast<T>(de[i * d + j] * ctx.c.embed_scale);
    }
  }
}

#define OLMOSFT_EMBEDDING_UNIT(T)                                                          \
  template void ScaledEmbeddingUnit::forward<T>(const Ctx<T>&, T*, const Saved<T>&) const; \
  template void ScaledEmbeddingUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, T*) const;
OLMOSFT_EMBEDDING_UNIT(float)
OLMOSFT_EMBEDDING_UNIT(double)
#undef OLMOSFT_EMBEDDING_UNIT

}  // namespace olmosft::model::unit
