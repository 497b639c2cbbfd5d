// Embedding unit of the hybrid (docs/reference/architecture.md B.2):  h0 = RMSNorm_embed(embed_scale *
// E[token]) (the norm only when embed_norm is configured). Parameters model.embed_tokens, model.embed_norm.
// Saves the scaled embedding rows and the norm's rstd (d + 1 floats per token); recomputes nothing.
#pragma once
#include <cstdint>

#include "model/unit.h"

namespace olmosft::model::unit {

struct ScaledEmbeddingUnit {
  int embed = -1, embed_norm = -1;

  template <typename T>
  struct Saved {
    T *e, *rs;  // [N, d], [N]
    void plan(Plan& p, const ModelConfig& c, int64_t N) {
      p.add(&e, N * c.hidden_size);
      p.add(&rs, N);
    }
  };

  static ScaledEmbeddingUnit resolve(const ParamIndex& idx);
  static int64_t saved_floats_per_token(const ModelConfig& c) { return c.hidden_size + 1; }

  // h [N, d] (overwritten) from ctx.b.tokens.
  template <typename T>
  void forward(const Ctx<T>& ctx, T* h, const Saved<T>& s) const;
  // Accumulates the embedding (and embed_norm) gradients from dh [N, d]; de: [N, d] scratch.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* dh, const Saved<T>& s, T* de) const;
};

}  // namespace olmosft::model::unit
