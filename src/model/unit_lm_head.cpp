// Final norm + LM head unit (see unit_lm_head.h).
#include "model/unit_lm_head.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "model/params.h"

namespace olmosft::model::unit {

LmHeadUnit LmHeadUnit::resolve(const ParamIndex& idx, const ModelConfig& c) {
  LmHeadUnit u;
  u.norm = idx.get(hf::kFinalNorm);
  u.lm_head = c.tie_word_embeddings ? idx.get(hf::kEmbedTokens) : idx.get(hf::kLmHead);
  return u;
}

template <typename T>
XentStats LmHeadUnit::forward(const Ctx<T>& ctx, const T* h, Saved<T>& s, float* logits,
                              float* logprobs) const {
  const int64_t N = ctx.N, d = ctx.d, V = ctx.c.vocab_size;
  const Batch& b = ctx.b;
  rmsnorm_forward(h, ctx.W(norm), s.hn, s.rs, N, d, ctx.c.rms_norm_eps);
  const T* Wlm = ctx.W(lm_head);
  std::fill(s.targets, s.targets + N, -100);
  std::fill(s.mask, s.mask + N, uint8_t(0));
  if (b.targets != nullptr) {
    for (int64_t i = 0; i < N; ++i) {
      const bool trained = (b.trained == nullptr || b.trained[i] != 0) && b.targets[i] != -100;
      if (!trained || !ctx.valid[i]) continue;
      OLMO_CHECK(b.targets[i] >= 0 && b.targets[i] < V, ctx.c.model_type_name, ": trained target ",
                 b.targets[i], " at row ", i / b.T, ", position ", i % b.T, " is outside [0, ", V, ")");
      s.targets[i] = b.targets[i];
      s.mask[i] = 1;
    }
  }
  s.xc = XentConfig{};
  s.xc.valid_vocab = V;
  s.xc.z_loss = ctx.loss->weight[kLossLmZ];
  s.xc.vocab_chunk = ctx.loss->vocab_tile;
  XentStats xs = xent_forward(s.hn, Wlm, s.targets, s.mask, N, d, V, s.xc, s.lse);
  if (logits != nullptr) {
    if constexpr (std::is_same_v<T, float>) {
      linear_forward(s.hn, Wlm, logits, N, d, V);
    } else {  // the float64 path (tests) computes in T, then rounds
      Vec<T> lg(static_cast<size_t>(N * V));
      linear_forward(s.hn, Wlm, lg.data(), N, d, V);
      for (size_t i = 0; i < lg.size(); ++i) logits[i] = static_cast<float>(lg[i]);
    }
  }
  if (logprobs != nullptr) {
    for (int64_t i = 0; i < N; ++i) {
      if (!s.mask[i]) {
        logprobs[i] = 0.0f;
        continue;
      }
      double dot = 0;
      const T* wr = Wlm + static_cast<int64_t>(s.targets[i]) * d;
      for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(s.hn[i * d + j]) * wr[j];
      logprobs[i] = static_cast<float>(dot - static_cast<double>(s.lse[i]));
    }
  }
  return xs;
}

template <typename T>
void LmHeadUnit::backward(const Ctx<T>& ctx, const T* h, const Saved<T>& s, double grad_scale, T* dh,
                          T* dhn) const {
  const int64_t N = ctx.N, d = ctx.d, V = ctx.c.vocab_size;
  xent_backward(s.hn, ctx.W(lm_head), s.targets, s.mask, s.lse, N, d, V, s.xc, grad_scale, dhn,
                ctx.G(lm_head));
  rmsnorm_backward(dhn, h, ctx.W(norm), s.rs, dh, ctx.G(norm), N, d, ctx.c.rms_norm_eps);
}

#define OLMOSFT_LM_HEAD_UNIT(T)                                                                        \
  template XentStats LmHeadUnit::forward<T>(const Ctx<T>&, const T*, Saved<T>&, float*, float*) const; \
  template void LmHeadUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, double, T*, T*) const;
OLMOSFT_LM_HEAD_UNIT(float)
OLMOSFT_LM_HEAD_UNIT(double)
#undef OLMOSFT_LM_HEAD_UNIT

}  // namespace olmosft::model::unit
