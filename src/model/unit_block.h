// The decoder block (docs/reference/architecture.md A.3, B.2, docs/olmo_hybrid.md): one mixer (softmax
// attention, KDA or Gated DeltaNet) and one FFN (dense SwiGLU or latent MoE), each wrapped in norms by the
// layer's placement (LayerSpec::pre_norm, post_norm):
//
//   post-norm (Olmo 3):           h_mid = x + N_post_attn(mixer(x));       y = h_mid + N_post_ffn(ffn(h_mid))
//   peri-LN (Olmo 3.5):           h_mid = x + N_post_attn(mixer(x1));      y = h_mid + N_post_ffn(ffn(x2))
//   pre-norm (Olmo Hybrid, GDN):  h_mid = x + mixer(x1);                   y = h_mid + ffn(x2)
//   with x1 = N_pre_attn(x), x2 = N_pre_ffn(h_mid).
//
// Parameters (declared in LayerSpec::hf_order): the norms hf::block_norms names for the placement, its
// mixer's and its FFN's. The block input x is the runner's residual stream, not saved here. Saves h_mid, on
// post-norm layers the mixer and FFN outputs and their norms' rstd, on pre-norm layers the two normed inputs
// and their rstd (saved_floats_per_token), plus its units' Saved. One Scratch serves every layer.
// Recomputation (model.remat, memory_policy.h): with Ctx::recompute_mixer the backward first re-runs the
// mixer's forward into its Saved (remat attn); remat full re-runs forward() from the kept input (the runner
// does that).
//
// The mixers a block can hold are listed once, in Mixers below; the block dispatches over them, and a layer's
// MixerKind (layers.h) is its mixer's index there.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "model/layers.h"
#include "model/unit.h"
#include "model/unit_attention.h"
#include "model/unit_emit.h"
#include "model/unit_ffn.h"
#include "model/unit_gdn.h"
#include "model/unit_kda.h"

namespace olmosft::model::unit {

// Every mixer unit: a new mixer kind is one entry here (and its unit file, and its case in layer_list). A
// mixer unit U has kName, kPrefix (its HF module under model.layers.<l>.), params(Params&, config, spec),
// Saved<T> / Scratch<T> with plan(), forward / backward, and the static sizes Block reads
// (saved_floats_per_token, gemm_weights_per_token, delta_rule_heads, widest_projection).
using Mixers = std::variant<AttentionUnit, KdaUnit, GdnUnit>;
inline constexpr size_t kMixerKinds = std::variant_size_v<Mixers>;
inline constexpr int kLayerKinds = static_cast<int>(kMixerKinds) * LayerSpec::kKindsPerMixer;

// The MixerKind of mixer unit U: its index in Mixers.
template <typename U, typename... Us>
constexpr size_t index_in(const std::variant<Us...>*) {
  constexpr bool same[] = {std::is_same_v<U, Us>...};
  size_t i = 0;
  while (i < sizeof...(Us) && !same[i]) ++i;
  return i;
}
template <typename U>
constexpr MixerKind mixer_kind() {
  constexpr size_t i = index_in<U>(static_cast<const Mixers*>(nullptr));
  static_assert(i < kMixerKinds, "not a unit of Mixers");
  return static_cast<MixerKind>(i);
}
template <typename U>
inline constexpr MixerKind kMixer = mixer_kind<U>();

// Per mixer kind, its Saved / Scratch for value type T (std::get<U::Saved<T>> picks a unit's).
template <typename T, typename V>
struct MixerBuffers;
template <typename T, typename... U>
struct MixerBuffers<T, std::variant<U...>> {
  using Saved = std::tuple<typename U::template Saved<T>...>;
  using Scratch = std::tuple<typename U::template Scratch<T>...>;
};
template <typename T>
using MixerSaved = typename MixerBuffers<T, Mixers>::Saved;
template <typename T>
using MixerScratch = typename MixerBuffers<T, Mixers>::Scratch;

// The units that emit themselves as StableHLO (unit_emit.h) declare an Emitted struct; per mixer kind, its
// Emitted (std::monostate for a kind the XLA backend does not emit yet).
template <typename U>
concept EmitsXla = requires {
  typename U::Emitted;
};
template <typename U>
struct EmittedOf {
  using type = std::monostate;
};
template <EmitsXla U>
struct EmittedOf<U> {
  using type = typename U::Emitted;
};
template <typename V>
struct MixerEmittedOf;
template <typename... U>
struct MixerEmittedOf<std::variant<U...>> {
  using type = std::tuple<typename EmittedOf<U>::type...>;
};
using MixerEmitted = MixerEmittedOf<Mixers>::type;

struct Block {
  LayerSpec spec;
  int pre_attn = -1, post_attn = -1, pre_ffn = -1, post_ffn = -1;
  Mixers mixer;
  SwiGluUnit mlp;  // dense layers
  MoeUnit moe;     // MoE layers

  template <typename T>
  struct Saved {
    T *x1 = nullptr, *rs_pre_attn = nullptr, *a = nullptr, *rs_post_attn = nullptr, *h_mid;  // by placement
    T *x2 = nullptr, *rs_pre_ffn = nullptr, *f = nullptr, *rs_post_ffn = nullptr;
    MixerSaved<T> mixer;       // by kind; the layer's kind is planned
    SwiGluUnit::Saved<T> mlp;  // dense layers
    MoeUnit::Saved<T> moe;     // MoE layers (vectors sized by moe.cpp)
    // Plans layer `spec`'s buffers: saved_floats_per_token(c, spec) * N values less the MoE cache; without
    // the mixer's Saved when !mixer (remat attn shares one across the layers).
    void plan(Plan& p, const ModelConfig& c, const LayerSpec& spec, int64_t N, bool mixer = true);
    size_t moe_bytes() const { return moe.bytes(); }
  };
  // Shared by the layers: the block's temporaries [N, d] and the units' scratch for the kinds present.
  template <typename T>
  struct Scratch {
    T *t, *dA, *dX = nullptr;  // dX: pre-norm (peri-LN) layers only
    MixerScratch<T> mixer;     // the kinds present are planned
    SwiGluUnit::Scratch<T> mlp;
    void plan(Plan& p, const ModelConfig& c, const std::vector<LayerSpec>& layers, int64_t N);
    static int64_t per_token(const ModelConfig& c, const std::vector<LayerSpec>& layers);
  };

  // XLA (unit_emit.h): the graph values the backward reads, as Saved.
  struct Emitted {
    std::optional<xla::Value> x1, rs_pre_attn, a, rs_post_attn, h_mid, x2, rs_pre_ffn, f, rs_post_ffn;
    MixerEmitted mixer;
    SwiGluUnit::Emitted mlp;  // dense layers
    MoeUnit::Emitted moe;     // MoE layers
  };
  // Throws naming the layer and what the XLA backend does not emit yet (a mixer kind without Emitted).
  static void check_emits(const ModelConfig& c, const LayerSpec& spec);
  xla::Value emit_forward(Emit& e, const xla::Value& x, Emitted& s) const;
  // dy -> dx (returned).
  xla::Value emit_backward(Emit& e, const xla::Value& x, const Emitted& s, const xla::Value& dy) const;

  // A block of layer `spec` with its mixer kind and no parameters resolved.
  static Block of(const LayerSpec& spec);
  // Declares (or resolves, unit.h Params) the layer's tensors in spec.hf_order: its norms, its mixer's and
  // its FFN's.
  void params(Params& p, const ModelConfig& c);
  static Block resolve(const ParamIndex& idx, const ModelConfig& c, const LayerSpec& spec);
  static int64_t saved_floats_per_token(const ModelConfig& c, const LayerSpec& spec);
  // FLOPs: the layer's per-token GEMM weight elements (its mixer's and FFN's), and per routed assignment.
  static double gemm_weights_per_token(const ModelConfig& c, const LayerSpec& spec);
  static double gemm_weights_per_routed(const ModelConfig& c, const LayerSpec& spec);
  // Its mixer's delta-rule heads (0 for attention) and the widest per-token projection of its units.
  static int64_t delta_rule_heads(const ModelConfig& c, const LayerSpec& spec);
  static int64_t widest_projection(const ModelConfig& c, const LayerSpec& spec);
  // Plans the mixer Saved of `kind` (remat attn's shared one).
  template <typename T>
  static void plan_mixer(Plan& p, const ModelConfig& c, MixerKind kind, int64_t N, MixerSaved<T>& s);

  // x [N, d] -> y [N, d]; an MoE layer's statistics and weighted auxiliary losses are added to lp.
  template <typename T>
  void forward(const Ctx<T>& ctx, const T* x, T* y, Saved<T>& s, const Scratch<T>& w, LossParts& lp) const;
  // dh [N, d] in place: dL/dy in, dL/dx out.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, T* dh, const Scratch<T>& w) const;

 private:
  template <typename T>
  void mixer_forward(const Ctx<T>& ctx, const T* x, T* a, const Saved<T>& s, const Scratch<T>& w) const;
  template <typename T>
  void mixer_backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* da, T* dx,
                      const Scratch<T>& w) const;
  template <typename T>
  void ffn_forward(const Ctx<T>& ctx, const T* x, T* f, Saved<T>& s, const Scratch<T>& w,
                   LossParts& lp) const;
};

}  // namespace olmosft::model::unit
