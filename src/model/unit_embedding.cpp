// Embedding unit of the hybrid (see unit_embedding.h).
#include "model/unit_embedding.h"

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
void ScaledEmbeddingUnit::forward(const Ctx<T>& ctx, Vec<T>& h, Saved<T>& s) const {
  const int64_t N = ctx.N, d = ctx.d;
  s.e.assign(static_cast<size_t>(N * d), T(0));
  const T* E = ctx.W(embed);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < d; ++j)
      s.e[static_cast<size_t>(i * d + j)] = static_cast<T>(E[ctx.b.tokens[i] * d + j] * ctx.c.embed_scale);
  h.resize(s.e.size());
  s.rs.resize(static_cast<size_t>(N));
  if (embed_norm >= 0)
    rmsnorm_forward(s.e.data(), ctx.W(embed_norm), h.data(), s.rs.data(), N, d, ctx.c.rms_norm_eps);
  else
    h = s.e;
}

template <typename T>
void ScaledEmbeddingUnit::backward(const Ctx<T>& ctx, const T* dh, const Saved<T>& s) const {
  const int64_t N = ctx.N, d = ctx.d;
  Vec<T> de(static_cast<size_t>(N * d));
  if (embed_norm >= 0)
    rmsnorm_backward(dh, s.e.data(), ctx.W(embed_norm), s.rs.data(), de.data(), ctx.G(embed_norm), N, d,
                     ctx.c.rms_norm_eps);
  else
    de.assign(dh, dh + N * d);
  if (T* dE = ctx.G(embed)) {
    for (int64_t i = 0; i < N; ++i) {
      T* row = dE + static_cast<int64_t>(ctx.b.tokens[i]) * d;
      for (int64_t j = 0; j < d; ++j)
        row[j] += static_cast<T>(de[static_cast<size_t>(i * d + j)] * ctx.c.embed_scale);
    }
  }
}

template void ScaledEmbeddingUnit::forward<float>(const Ctx<float>&, Vec<float>&, Saved<float>&) const;
template void ScaledEmbeddingUnit::forward<double>(const Ctx<double>&, Vec<double>&, Saved<double>&) const;
template void ScaledEmbeddingUnit::backward<float>(const Ctx<float>&, const float*,
                                                   const Saved<float>&) const;
template void ScaledEmbeddingUnit::backward<double>(const Ctx<double>&, const double*,
                                                    const Saved<double>&) const;

}  // namespace olmosft::model::unit
