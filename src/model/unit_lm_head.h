// Final norm + LM head unit (docs/reference/architecture.md A.2, B.2):  logits = RMSNorm_final(h)
// Wlm^T, the loss by the tiled cross-entropy with z-loss (kernels/cross_entropy). Parameters model.norm,
// lm_head (model.embed_tokens when tied). Saves the normalised h, its rstd and the per-token logsumexp (d + 2
// floats per token) plus the checked targets and mask; the logits are never stored (the backward
// recomputes them tile by tile).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/cross_entropy.h"
#include "model/unit.h"
#include "model/unit_emit.h"
#include "xla/ops_xent.h"

namespace olmosft::model::unit {

struct LmHeadUnit {
  int norm = -1, lm_head = -1;

  template <typename T>
  struct Saved {
    T *hn, *rs, *lse;  // [N, d], [N], [N]
    int32_t* targets;  // [N] -100 where not trained
    uint8_t* mask;     // [N] 1 = trained (Batch::trained if given) target != -100, not padding
    XentConfig xc;
    void plan(Plan& p, const ModelConfig& c, int64_t N) {
      p.add(&hn, N * c.hidden_size);
      for (T** b : {&rs, &lse}) p.add(b, N);
      p.add(&targets, N);
      p.add(&mask, N);
    }
  };

  // Declares (or resolves, unit.h Params) its tensors, in HF order; tied, lm_head is the embedding's.
  void params(Params& p, const ModelConfig& c);
  static LmHeadUnit resolve(const ParamIndex& idx, const ModelConfig& c);
  static int64_t saved_floats_per_token(const ModelConfig& c) { return c.hidden_size + 4; }

  // h [N, d] -> loss sums; logits [N, V] / logprobs [N] (0 where untrained) when non-null.
  template <typename T>
  XentStats forward(const Ctx<T>& ctx, const T* h, Saved<T>& s, float* logits, float* logprobs) const;
  // dh [N, d] (overwritten) of grad_scale * (ce_sum + lm_z * z_sum); dhn: [N, d] scratch.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* h, const Saved<T>& s, double grad_scale, T* dh, T* dhn) const;

  // The trained targets of a batch as forward() checks and keeps them: targets[i] (-100 where not trained)
  // and mask[i] = 1 where trained: (Batch::trained null or set) and target != -100 and valid[i] (not
  // padding). Throws naming the row and position of a trained target outside the vocabulary.
  static void trained_targets(const ModelConfig& c, const Batch& b, const uint8_t* valid, int32_t* targets,
                              uint8_t* mask);

  // XLA (unit_emit.h). TARGETS s32 [N] (any id in [0, V) where untrained) and MASK s32 [N] (1 = trained)
  // are graph arguments filled from trained_targets. The graph keeps the normed h, its rstd and the lse.
  struct Emitted {
    std::optional<xla::Value> hn, rs, lse, targets, mask;
  };
  xla::ops::XentForward emit_forward(Emit& e, const xla::Value& h, const xla::Value& targets,
                                     const xla::Value& mask, Emitted& s) const;
  // logits [N, V] (small inputs only) and log p(target) [N] (0 where untrained) of the forward.
  xla::Value emit_logits(Emit& e, const Emitted& s) const;
  xla::Value emit_logprobs(Emit& e, const Emitted& s) const;
  // dh of  scale * (ce_sum + lm_z * z_sum);  SCALE: f32 scalar argument (the call's grad_scale).
  xla::Value emit_backward(Emit& e, const xla::Value& h, const Emitted& s, const xla::Value& scale) const;
};

}  // namespace olmosft::model::unit
