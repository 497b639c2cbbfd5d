// Final norm + LM head unit (see unit_lm_head.h).
#include "model/unit_lm_head.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "model/params.h"

namespace olmosft::model::unit {

void LmHeadUnit::params(Params& p, const ModelConfig& c) {
  p.add(norm, hf::kFinalNorm, {c.hidden_size});
  if (!c.tie_word_embeddings) p.add(lm_head, hf::kLmHead, {c.vocab_size, c.hidden_size});
}

LmHeadUnit LmHeadUnit::resolve(const ParamIndex& idx, const ModelConfig& c) {
  LmHeadUnit u;
  Params p(idx);
  u.params(p, c);
  if (c.tie_word_embeddings) u.lm_head = idx.get(hf::kEmbedTokens);
  return u;
}

void LmHeadUnit::trained_targets(const ModelConfig& c, const Batch& b, const uint8_t* valid, int32_t* targets,
                                 uint8_t* mask) {
  const int64_t N = b.B * b.T, V = c.vocab_size;
  std::fill(targets, targets + N, -100);
  std::fill(mask, mask + N, uint8_t(0));
  if (b.targets == nullptr) return;
  for (int64_t i = 0; i < N; ++i) {
    const bool trained = (b.trained == nullptr || b.trained[i] != 0) && b.targets[i] != -100;
    if (!trained || !valid[i]) continue;
    OLMO_CHECK(b.targets[i] >= 0 && b.targets[i] < V, c.model_type_name, ": trained target ", b.targets[i],
               " at row ", i / b.T, ", position ", i % b.T, " is outside [0, ", V, ")");
    targets[i] = b.targets[i];
    mask[i] = 1;
  }
}

template <typename T>
XentStats LmHeadUnit::forward(const Ctx<T>& ctx, const T* h, Saved<T>& s, float* logits,
                              float* logprobs) const {
  const int64_t N = ctx.N, d = ctx.d, V = ctx.c.vocab_size;
  const Batch& b = ctx.b;
  rmsnorm_forward(h, ctx.W(norm), s.hn, s.rs, N, d, ctx.c.rms_norm_eps);
  const T* Wlm = ctx.W(lm_head);
  trained_targets(ctx.c, b, ctx.valid, s.targets, s.mask);
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

namespace {

xla::ops::XentOptions emit_xent_options(const Emit& e) {
  xla::ops::XentOptions o;
  o.valid_vocab = e.c.vocab_size;
  o.z_loss = e.loss.weight[kLossLmZ];
  o.vocab_chunk = e.loss.vocab_tile;
  o.operands = e.operands;
  o.mesh = e.mesh;
  return o;
}

}  // namespace

xla::ops::XentForward LmHeadUnit::emit_forward(Emit& e, const xla::Value& h, const xla::Value& targets,
                                               const xla::Value& mask, Emitted& s) const {
  const xla::ops::RmsNormForward n = xla::ops::rmsnorm_forward(e.b, h, e.W(norm), e.c.rms_norm_eps);
  s.hn = n.y;
  s.rs = n.rstd;
  s.targets = targets;
  s.mask = mask;
  xla::ops::XentForward xf =
      xla::ops::xent_forward(e.b, n.y, e.W(lm_head), targets, mask, emit_xent_options(e));
  s.lse = xf.lse;
  return xf;
}

xla::Value LmHeadUnit::emit_logits(Emit& e, const Emitted& s) const {
  return xla::ops::linear_forward(e.b, *s.hn, e.W(lm_head), e.operands);
}

xla::Value LmHeadUnit::emit_logprobs(Emit& e, const Emitted& s) const {
  auto& b = e.b;
  const xla::Value rows = b.gather_rows(e.W(lm_head), *s.targets);  // [N, d]
  const xla::Value lp = b.sub(b.reduce_sum(b.mul(*s.hn, rows), {1}), *s.lse);
  const xla::Value trained = b.compare(*s.mask, b.constant(s.mask->type(), 0.0), xla::Compare::kNe);
  return b.select(trained, lp, b.constant(lp.type(), 0.0));
}

xla::Value LmHeadUnit::emit_backward(Emit& e, const xla::Value& h, const Emitted& s,
                                     const xla::Value& scale) const {
  const xla::ops::XentBackward xb = xla::ops::xent_backward(e.b, *s.hn, e.W(lm_head), *s.targets, *s.mask,
                                                            *s.lse, scale, emit_xent_options(e));
  e.grad(lm_head, xb.dw);
  const xla::ops::RmsNormBackward r = xla::ops::rmsnorm_backward(e.b, xb.dh, h, e.W(norm), *s.rs);
  e.grad(norm, *r.dw);
  return r.dx;
}

#define OLMOSFT_LM_HEAD_UNIT(T)                                                                        \
  template XentStats LmHeadUnit::forward<T>(const Ctx<T>&, const T*, Saved<T>&, float*, float*) const; \
  template void LmHeadUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, double, T*, T*) const;
OLMOSFT_LM_HEAD_UNIT(float)
OLMOSFT_LM_HEAD_UNIT(double)
#undef OLMOSFT_LM_HEAD_UNIT

}  // namespace olmosft::model::unit
