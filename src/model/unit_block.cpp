// The decoder block (see unit_block.h).
#include "model/unit_block.h"

#include <algorithm>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/rmsnorm.h"
#include "model/params.h"

namespace olmosft::model::unit {

namespace {

// Calls f(std::integral_constant<size_t, I>) for the mixer kind I == k (Mixers is in MixerKind order).
template <size_t I = 0, typename F>
void with_mixer_kind(size_t k, F&& f) {
  if constexpr (I < std::variant_size_v<Mixers>) {
    if (k == I) return f(std::integral_constant<size_t, I>{});
    with_mixer_kind<I + 1>(k, std::forward<F>(f));
  }
}

template <typename T>
void residual_add(const T* x, const T* t, T* y, int64_t n) {
  parallel_for(
      n,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) y[i] = x[i] + t[i];
      },
      1 << 14);
}

// What the shared Scratch must hold for a layer list (plan and per_token read the same answer).
struct ScratchNeeds {
  bool peri = false;                             // a peri-LN layer: dX
  bool mixer[std::variant_size_v<Mixers>] = {};  // the mixer kinds present
  int64_t ffn_hidden = 0;                        // the largest SwiGLU hidden size
};

ScratchNeeds scratch_needs(const std::vector<LayerSpec>& layers) {
  ScratchNeeds n;
  for (const LayerSpec& s : layers) {
    n.peri = n.peri || s.pre_norm;
    n.mixer[static_cast<size_t>(s.mixer)] = true;
    if (s.ffn == FfnKind::SwiGlu) n.ffn_hidden = std::max(n.ffn_hidden, s.ffn_hidden);
  }
  return n;
}

}  // namespace

Block Block::of(const LayerSpec& spec) {
  Block b;
  b.spec = spec;
  with_mixer_kind(static_cast<size_t>(spec.mixer), [&](auto I) { b.mixer.template emplace<I>(); });
  return b;
}

void Block::params(Params& p, const ModelConfig& c) {
  const std::string l = hf::layer(spec.index);
  const hf::BlockNorms names = hf::block_norms(spec);
  p.set_layer(spec.index);
  for (const LayerPart part : spec.hf_order) {
    if (part == LayerPart::Mixer) {
      std::visit([&](auto& u) { u.params(p, c, spec); }, mixer);
    } else if (part == LayerPart::Ffn) {
      if (spec.ffn == FfnKind::SwiGlu)
        mlp.params(p, c, l + hf::kMlp, spec.ffn_hidden);
      else
        moe.params(p, c, l + hf::kMlp);
    } else {
      for (auto [slot, name] : {std::pair{&pre_attn, names.pre_attn}, std::pair{&post_attn, names.post_attn},
                                std::pair{&pre_ffn, names.pre_ffn}, std::pair{&post_ffn, names.post_ffn}})
        if (name != nullptr) p.add(*slot, l + name, {c.hidden_size});
    }
  }
  p.set_layer(-1);
}

Block Block::resolve(const ParamIndex& idx, const ModelConfig& c, const LayerSpec& spec) {
  Block b = of(spec);
  Params p(idx);
  b.params(p, c);
  return b;
}

int64_t Block::saved_floats_per_token(const ModelConfig& c, const LayerSpec& spec) {
  const int64_t d = c.hidden_size;
  // h_mid; a f + 2 rstd (post-norm); x1 x2 + 2 rstd (pre-norm)
  int64_t n = d + (spec.post_norm ? 2 * d + 2 : 0) + (spec.pre_norm ? 2 * d + 2 : 0);
  with_mixer_kind(static_cast<size_t>(spec.mixer),
                  [&](auto I) { n += std::variant_alternative_t<I, Mixers>::saved_floats_per_token(c); });
  n += spec.ffn == FfnKind::SwiGlu ? SwiGluUnit::saved_floats_per_token(spec.ffn_hidden)
                                   : MoeUnit::saved_floats_per_token(c);
  return n;
}

double Block::gemm_weights_per_token(const ModelConfig& c, const LayerSpec& spec) {
  double w = 0;
  with_mixer_kind(static_cast<size_t>(spec.mixer),
                  [&](auto I) { w = std::variant_alternative_t<I, Mixers>::gemm_weights_per_token(c); });
  return w + (spec.ffn == FfnKind::SwiGlu ? SwiGluUnit::gemm_weights_per_token(c, spec.ffn_hidden)
                                          : MoeUnit::gemm_weights_per_token(c));
}

int64_t Block::delta_rule_heads(const ModelConfig& c, const LayerSpec& spec) {
  int64_t h = 0;
  with_mixer_kind(static_cast<size_t>(spec.mixer),
                  [&](auto I) { h = std::variant_alternative_t<I, Mixers>::delta_rule_heads(c); });
  return h;
}

int64_t Block::widest_projection(const ModelConfig& c, const LayerSpec& spec) {
  int64_t w = 0;
  with_mixer_kind(static_cast<size_t>(spec.mixer),
                  [&](auto I) { w = std::variant_alternative_t<I, Mixers>::widest_projection(c); });
  return std::max(w, spec.ffn == FfnKind::SwiGlu ? spec.ffn_hidden : c.shared_expert_intermediate_size);
}

double Block::gemm_weights_per_routed(const ModelConfig& c, const LayerSpec& spec) {
  return spec.ffn == FfnKind::Moe ? MoeUnit::gemm_weights_per_routed(c) : 0.0;
}

template <typename T>
void Block::plan_mixer(Plan& p, const ModelConfig& c, MixerKind kind, int64_t N, MixerSaved<T>& s) {
  with_mixer_kind(static_cast<size_t>(kind), [&](auto I) { std::get<I>(s).plan(p, c, N); });
}

template <typename T>
void Block::Saved<T>::plan(Plan& p, const ModelConfig& c, const LayerSpec& spec, int64_t N, bool with_mixer) {
  const int64_t d = c.hidden_size;
  if (spec.pre_norm) {
    for (T** b : {&x1, &x2}) p.add_activation(b, N * d);
    for (T** b : {&rs_pre_attn, &rs_pre_ffn}) p.add(b, N);
  }
  p.add_activation(&h_mid, N * d);
  if (spec.post_norm) {
    for (T** b : {&a, &f}) p.add_activation(b, N * d);
    for (T** b : {&rs_post_attn, &rs_post_ffn}) p.add(b, N);
  }
  if (with_mixer) plan_mixer<T>(p, c, spec.mixer, N, mixer);
  if (spec.ffn == FfnKind::SwiGlu) mlp.plan(p, spec.ffn_hidden, N);
}

template <typename T>
void Block::Scratch<T>::plan(Plan& p, const ModelConfig& c, const std::vector<LayerSpec>& layers, int64_t N) {
  const int64_t d = c.hidden_size;
  const ScratchNeeds need = scratch_needs(layers);
  for (T** b : {&t, &dA}) p.add(b, N * d);
  dX = nullptr;
  if (need.peri) p.add(&dX, N * d);
  for (size_t k = 0; k < std::variant_size_v<Mixers>; ++k)
    if (need.mixer[k]) with_mixer_kind(k, [&](auto I) { std::get<I>(mixer).plan(p, c, N); });
  if (need.ffn_hidden > 0) mlp.plan(p, need.ffn_hidden, N);
}

template <typename T>
int64_t Block::Scratch<T>::per_token(const ModelConfig& c, const std::vector<LayerSpec>& layers) {
  const ScratchNeeds need = scratch_needs(layers);
  int64_t n = (need.peri ? 3 : 2) * c.hidden_size + 2 * need.ffn_hidden;
  for (size_t k = 0; k < std::variant_size_v<Mixers>; ++k)
    if (need.mixer[k])
      with_mixer_kind(
          k, [&](auto I) { n += std::variant_alternative_t<I, Mixers>::template Scratch<T>::per_token(c); });
  return n;
}

template <typename T>
void Block::mixer_forward(const Ctx<T>& ctx, const T* x, T* a, const Saved<T>& s, const Scratch<T>& w) const {
  std::visit(
      [&](const auto& u) {
        using U = std::decay_t<decltype(u)>;
        u.forward(ctx, x, a, std::get<typename U::template Saved<T>>(s.mixer),
                  std::get<typename U::template Scratch<T>>(w.mixer));
      },
      mixer);
}

template <typename T>
void Block::mixer_backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx,
                           const Scratch<T>& w) const {
  std::visit(
      [&](const auto& u) {
        using U = std::decay_t<decltype(u)>;
        u.backward(ctx, x, std::get<typename U::template Saved<T>>(s.mixer), da, dx,
                   std::get<typename U::template Scratch<T>>(w.mixer));
      },
      mixer);
}

template <typename T>
void Block::ffn_forward(const Ctx<T>& ctx, const T* x, T* f, Saved<T>& s, const Scratch<T>& w,
                        LossParts& lp) const {
  if (spec.ffn == FfnKind::SwiGlu) return mlp.forward(ctx, x, f, s.mlp, w.mlp);
  const moe::MoeStats st = moe.forward(ctx, x, f, s.moe);
  MoeLayerStats ms;
  ms.layer = spec.index;
  ms.lb_loss = st.lb;
  ms.router_z = st.router_z;
  ms.required_buffer_factor = st.required_buffer_factor;
  ms.dropped_tokens = st.dropped;
  lp.sum[kLossMoeLb] += ctx.loss->weight[kLossMoeLb] * st.lb;
  lp.sum[kLossRouterZ] += ctx.loss->weight[kLossRouterZ] * st.router_z;
  lp.moe_layers.push_back(ms);
}

template <typename T>
void Block::forward(const Ctx<T>& ctx, const T* x, T* y, Saved<T>& s, const Scratch<T>& w,
                    LossParts& lp) const {
  const int64_t N = ctx.N, d = ctx.d;
  const double eps = ctx.c.rms_norm_eps;
  const T* xm = x;  // the mixer's input
  if (spec.pre_norm) {
    rmsnorm_forward(x, ctx.W(pre_attn), s.x1, s.rs_pre_attn, N, d, eps);
    xm = s.x1;
  }
  // the sub-layer's output, normed into w.t on post-norm layers (else written there)
  mixer_forward(ctx, xm, spec.post_norm ? s.a : w.t, s, w);
  if (spec.post_norm) rmsnorm_forward(s.a, ctx.W(post_attn), w.t, s.rs_post_attn, N, d, eps);
  residual_add(x, w.t, s.h_mid, N * d);
  const T* xf = s.h_mid;  // the FFN's input
  if (spec.pre_norm) {
    rmsnorm_forward(s.h_mid, ctx.W(pre_ffn), s.x2, s.rs_pre_ffn, N, d, eps);
    xf = s.x2;
  }
  ffn_forward(ctx, xf, spec.post_norm ? s.f : w.t, s, w, lp);
  if (spec.post_norm) rmsnorm_forward(s.f, ctx.W(post_ffn), w.t, s.rs_post_ffn, N, d, eps);
  residual_add(s.h_mid, w.t, y, N * d);
}

template <typename T>
void Block::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, T* dh, const Scratch<T>& w) const {
  const int64_t N = ctx.N, d = ctx.d;
  const double eps = ctx.c.rms_norm_eps;
  // y = h_mid + RMSNorm_post_ffn(f) (or + f): df = dA (or dh); a pre-norm layer's FFN gradient goes through
  // its pre-norm (dX).
  const T* df = dh;
  if (spec.post_norm) {
    rmsnorm_backward(dh, s.f, ctx.W(post_ffn), s.rs_post_ffn, w.dA, ctx.G(post_ffn), N, d, eps);
    df = w.dA;
  }
  auto ffn_backward = [&](const T* xf, T* dx) {
    if (spec.ffn == FfnKind::SwiGlu)
      mlp.backward(ctx, xf, s.mlp, df, dx, w.mlp);
    else
      moe.backward(ctx, xf, s.moe, df, dx);
  };
  if (spec.pre_norm) {
    std::fill(w.dX, w.dX + N * d, T(0));
    ffn_backward(s.x2, w.dX);
    rmsnorm_backward(w.dX, s.h_mid, ctx.W(pre_ffn), s.rs_pre_ffn, w.t, ctx.G(pre_ffn), N, d, eps);
    add_into(dh, w.t, N * d);
  } else {
    ffn_backward(s.h_mid, dh);
  }
  // h_mid = x + RMSNorm_post_attn(a) (or + a)
  const T* da = dh;
  if (spec.post_norm) {
    rmsnorm_backward(dh, s.a, ctx.W(post_attn), s.rs_post_attn, w.dA, ctx.G(post_attn), N, d, eps);
    da = w.dA;
  }
  const T* xm = spec.pre_norm ? s.x1 : x;
  // remat attn: the mixer's Saved is shared by the layers: re-run this layer's into it
  if (ctx.recompute_mixer) mixer_forward(ctx, xm, w.t, s, w);
  if (spec.pre_norm) {
    std::fill(w.dX, w.dX + N * d, T(0));
    mixer_backward(ctx, xm, s, da, w.dX, w);
    rmsnorm_backward(w.dX, x, ctx.W(pre_attn), s.rs_pre_attn, w.t, ctx.G(pre_attn), N, d, eps);
    add_into(dh, w.t, N * d);
  } else {
    mixer_backward(ctx, xm, s, da, dh, w);
  }
}

// ---- XLA: the same block as StableHLO (unit_emit.h) -----------------------------------------------------

void Block::check_emits(const ModelConfig& c, const LayerSpec& spec) {
  bool mixer_emits = false;
  const char* name = "";
  with_mixer_kind(static_cast<size_t>(spec.mixer), [&](auto I) {
    using U = std::variant_alternative_t<I, Mixers>;
    mixer_emits = EmitsXla<U>;
    name = U::kName;
  });
  OLMO_CHECK(mixer_emits, c.model_type_name, ": layer ", spec.index, "'s mixer (", name,
             ") is not emitted by the XLA backend yet; use device: cpu");
}

xla::Value Block::emit_forward(Emit& e, const xla::Value& x, Emitted& s) const {
  namespace ops = xla::ops;
  auto& b = e.b;
  const double eps = e.c.rms_norm_eps;
  auto norm = [&](const xla::Value& in, int gain, std::optional<xla::Value>& rs) {
    ops::RmsNormForward n = ops::rmsnorm_forward(b, in, e.W(gain), eps);
    rs = n.rstd;
    return n.y;
  };
  xla::Value xm = x;
  if (spec.pre_norm) s.x1 = xm = norm(x, pre_attn, s.rs_pre_attn);
  s.a = std::visit(
      [&](const auto& u) -> xla::Value {
        using U = std::decay_t<decltype(u)>;
        if constexpr (EmitsXla<U>) {
          return u.emit_forward(e, xm, std::get<typename U::Emitted>(s.mixer));
        } else {
          check_emits(e.c, spec);
          throw Error("unreachable");
        }
      },
      mixer);
  s.h_mid = b.add(x, spec.post_norm ? norm(*s.a, post_attn, s.rs_post_attn) : *s.a);
  xla::Value xf = *s.h_mid;
  if (spec.pre_norm) s.x2 = xf = norm(*s.h_mid, pre_ffn, s.rs_pre_ffn);
  s.f = spec.ffn == FfnKind::SwiGlu ? mlp.emit_forward(e, xf, s.mlp) : moe.emit_forward(e, xf, s.moe);
  return b.add(*s.h_mid, spec.post_norm ? norm(*s.f, post_ffn, s.rs_post_ffn) : *s.f);
}

xla::Value Block::emit_backward(Emit& e, const xla::Value& x, const Emitted& s, const xla::Value& dy) const {
  namespace ops = xla::ops;
  auto& b = e.b;
  // d(norm(in)) given dout: the input's gradient; the gain's is accumulated
  auto norm_back = [&](const xla::Value& dout, const xla::Value& in, int gain,
                       const std::optional<xla::Value>& rs) {
    ops::RmsNormBackward r = ops::rmsnorm_backward(b, dout, in, e.W(gain), *rs);
    e.grad(gain, *r.dw);
    return r.dx;
  };
  // y = h_mid + RMSNorm_post_ffn(f) (or + f)
  const xla::Value df = spec.post_norm ? norm_back(dy, *s.f, post_ffn, s.rs_post_ffn) : dy;
  const xla::Value& xf = spec.pre_norm ? *s.x2 : *s.h_mid;
  const xla::Value dxf =
      spec.ffn == FfnKind::SwiGlu ? mlp.emit_backward(e, xf, s.mlp, df) : moe.emit_backward(e, xf, s.moe, df);
  const xla::Value dh = b.add(dy, spec.pre_norm ? norm_back(dxf, *s.h_mid, pre_ffn, s.rs_pre_ffn) : dxf);
  // h_mid = x + RMSNorm_post_attn(a) (or + a)
  xla::Value da = spec.post_norm ? norm_back(dh, *s.a, post_attn, s.rs_post_attn) : dh;
  xla::Value xm = spec.pre_norm ? *s.x1 : x;
  // remat attn: the mixer's forward again from its (fenced) input, its own intermediates dropped
  const bool again = e.remat == Remat::Attn;
  if (again) {
    const std::vector<xla::Value> fenced = b.optimization_barrier({xm, da});
    xm = fenced[0], da = fenced[1];
  }
  const xla::Value dxm = std::visit(
      [&](const auto& u) -> xla::Value {
        using U = std::decay_t<decltype(u)>;
        if constexpr (EmitsXla<U>) {
          if (again) {
            typename U::Emitted fresh;
            u.emit_forward(e, xm, fresh);
            return u.emit_backward(e, xm, fresh, da);
          }
          return u.emit_backward(e, xm, std::get<typename U::Emitted>(s.mixer), da);
        } else {
          check_emits(e.c, spec);
          throw Error("unreachable");
        }
      },
      mixer);
  return b.add(dh, spec.pre_norm ? norm_back(dxm, x, pre_attn, s.rs_pre_attn) : dxm);
}

#define OLMOSFT_BLOCK(T)                                                                                 \
  template struct Block::Saved<T>;                                                                       \
  template struct Block::Scratch<T>;                                                                     \
  template void Block::plan_mixer<T>(Plan&, const ModelConfig&, MixerKind, int64_t, MixerSaved<T>&);     \
  template void Block::forward<T>(const Ctx<T>&, const T*, T*, Saved<T>&, const Scratch<T>&, LossParts&) \
      const;                                                                                             \
  template void Block::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, T*, const Scratch<T>&) const;
OLMOSFT_BLOCK(float)
OLMOSFT_BLOCK(double)
#undef OLMOSFT_BLOCK

}  // namespace olmosft::model::unit
