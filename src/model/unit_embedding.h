// Embedding unit (docs/reference/architecture.md A.2, B.2):  h0 = RMSNorm_embed(embed_scale * E[token]),
// the norm only when the config has model.embed_norm (the hybrid's embed_norm; Olmo 3 has none and scale 1).
// Parameters model.embed_tokens, model.embed_norm. With the norm it saves the scaled rows and the norm's
// rstd (d + 1 floats per token); without it, nothing.
#pragma once
#include <cstdint>
#include <optional>

#include "model/unit.h"
#include "model/unit_emit.h"

namespace olmosft::model::unit {

struct EmbeddingUnit {
  int embed = -1, embed_norm = -1;

  template <typename T>
  struct Saved {
    T *e = nullptr, *rs = nullptr;  // [N, d], [N] (with the norm)
    void plan(Plan& p, const ModelConfig& c, int64_t N) {
      if (!c.embed_norm) return;
      p.add(&e, N * c.hidden_size);
      p.add(&rs, N);
    }
  };

  // Declares (or resolves, unit.h Params) its tensors, in HF order.
  void params(Params& p, const ModelConfig& c);
  static int64_t saved_floats_per_token(const ModelConfig& c) { return c.embed_norm ? c.hidden_size + 1 : 0; }
  // Whether the backward reads parameter values (the norm's gain), so that a sharded model gathers them.
  bool backward_reads_weights() const { return embed_norm >= 0; }

  // h [N, d] (overwritten) from ctx.b.tokens.
  template <typename T>
  void forward(const Ctx<T>& ctx, T* h, const Saved<T>& s) const;
  // Accumulates the embedding (and embed_norm) gradients from dh [N, d]; de: [N, d] scratch.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* dh, const Saved<T>& s, T* de) const;

  // XLA (unit_emit.h): rows gathered from Emit::tokens; the backward scatter-adds them (ids repeat). The
  // graph keeps the scaled rows and the norm's rstd when there is a norm.
  struct Emitted {
    std::optional<xla::Value> e, rs;
  };
  xla::Value emit_forward(Emit& e, Emitted& s) const;
  void emit_backward(Emit& e, const Emitted& s, const xla::Value& dh) const;
};

}  // namespace olmosft::model::unit
