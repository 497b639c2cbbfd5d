// Layer units: the common pieces. A unit is one layer kind (embedding, a mixer, an FFN, the LM head) with
// its forward and backward side by side, like the kernels of src/kernels. Each unit
//   - declares its parameters once, in params(Params&, ...) (HF name, shape, flags, in HF state-dict order):
//     the parameter registry (model/params.h) is these declarations in order, and the unit holds its
//     parameters as indices into it, resolved by name once (Params, below);
//   - keeps what its backward needs in a `Saved` struct of pointers and declares its size per token
//     (saved_floats_per_token; integer and byte fields count as one float each); Saved::plan (and
//     Scratch::plan for the backward's temporaries) requests those buffers from the model's one
//     workspace block (Plan, below);
//   - documents in its header what it saves and what its backward recomputes.
// Units are templated on the value type T where the hybrid needs its float64 path (finite-difference
// tests). docs/model.md, "Layer units", lists them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kda.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"

namespace olmosft::model::unit {

template <typename T>
using Vec = std::vector<T>;

template <typename T>
void add_into(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// HF tensor name -> registry index, for resolving a unit's parameters once.
class ParamIndex {
 public:
  explicit ParamIndex(const ModelConfig& c);
  // Index of `name`; -1 when absent and !required, otherwise absence throws naming `who` and the tensor.
  int get(const std::string& name, bool required = true) const;
  size_t size() const { return size_; }
  std::string who = "model";

 private:
  std::map<std::string, int> by_;
  size_t size_ = 0;
};

// A unit's parameters are declared once, by its params(Params& p, ...): for each tensor, in HF state-dict
// order, p.add(slot, full HF name, shape, flags). Collecting (param_registry, model/params.h) appends the
// rows to the registry, and sets each slot to its row's index; resolving (ParamIndex) sets each slot to the
// tensor's registry index. Either way the unit's slots hold registry indices.
class Params {
 public:
  explicit Params(std::vector<ParamSpec>& rows) : rows_(&rows) {}
  explicit Params(const ParamIndex& idx) : idx_(&idx) {}
  // ROUTED: a routed expert's weight (ParamSpec::routed_expert); FP32: kept in fp32 (fp32_master_only).
  // Decay: every tensor of 2 or more dimensions but a norm's gain.
  void add(int& slot, std::string name, Shape shape, bool routed = false, bool fp32 = false);
  void set_layer(int64_t layer) { layer_ = layer; }

 private:
  std::vector<ParamSpec>* rows_ = nullptr;
  const ParamIndex* idx_ = nullptr;
  int64_t layer_ = -1;
};

// What the units of one call read: the batch, derived per-token arrays, and the weight / gradient
// pointers in registry order (g == nullptr: forward only).
template <typename T>
struct Ctx {
  const ModelConfig& c;
  const Batch& b;
  const std::vector<const T*>& w;
  const std::vector<T*>* g = nullptr;
  int64_t N = 0, d = 0;            // B*T tokens, hidden size
  const int32_t* seg = nullptr;    // [N] document id per token (< 0 = padding)
  const uint8_t* valid = nullptr;  // [N] 1 = not padding
  const T* logpos = nullptr;       // [N] log(position + 1) (scalable softmax)
  const T* rope_cos[3] = {};       // per RopeKind: [N, head_dim / 2] tables at the tokens' positions
  const T* rope_sin[3] = {};
  void* attn_ws = nullptr;  // the attention kernel's workspace (attention_workspace_bytes<T>)
  size_t attn_ws_bytes = 0;
  const LossConfig* loss = nullptr;  // MoE capacity and auxiliary-loss coefficients
  double aux_scale = 1.0;            // multiplies the MoE auxiliary losses' gradients
  int64_t kda_chunk = 64;            // KDA chunk size
  bool kda_recurrent = false;        // KDA: token-by-token recurrence instead of the chunked form
  bool recompute_mixer = false;      // remat attn: blocks re-run the mixer's forward before its backward

  const T* W(int idx) const { return w[static_cast<size_t>(idx)]; }
  T* G(int idx) const { return (g == nullptr || idx < 0) ? nullptr : (*g)[static_cast<size_t>(idx)]; }
};

// The delta-rule kernels' dimensions (kernels/kda.h) for a context's batch: HEADS heads of the config's
// linear key / value head sizes (KDA: its heads; GDN: its value heads).
template <typename T>
kda::KdaDims delta_rule_dims(const Ctx<T>& ctx, int64_t heads) {
  return {ctx.b.B, ctx.b.T, heads, ctx.c.linear_key_head_dim, ctx.c.linear_value_head_dim};
}

struct Bf16Store;

// A workspace plan: (pointer, count) requests of any element type (float, double, int32, bytes) carved
// from one block, each rounded up to 64 bytes. Units add their Saved / Scratch buffers; the model
// allocates bytes() once and carves them, and keeps the block while the token count does not grow.
class Plan {
 public:
  template <typename U>
  void add(U** ptr, int64_t n) {
    items_.push_back({ptr, static_cast<size_t>(n) * sizeof(U),
                      [](void* slot, std::byte* at) { *static_cast<U**>(slot) = reinterpret_cast<U*>(at); }});
  }
  // A Saved's activation (a tensor the backward reads, as opposed to a per-token statistic such as an
  // RMS-norm rstd or a softmax normaliser): planned as add() does, or, while a Bf16Store is set and U is
  // float, as an fp32 staging buffer plus a bf16 copy (see Bf16Store).
  template <typename U>
  void add_activation(U** ptr, int64_t n) {
    if constexpr (std::is_same_v<U, float>) {
      if (bf16_ != nullptr) return add_bf16(ptr, n);
    }
    add(ptr, n);
  }
  void keep_activations_in(Bf16Store* store, int64_t tokens);  // nullptr: plain add() again
  // One region that each of `alternatives` is carved into at the same address: buffers that are never
  // live at the same time (recomputation's one Saved per layer kind). Its size is the largest one's.
  void add_overlay(std::vector<Plan> alternatives);
  size_t bytes() const;
  void carve(std::byte* base) const;  // base: 64-byte aligned, bytes() long

 private:
  struct Item {
    void* slot;
    size_t bytes;
    void (*set)(void*, std::byte*);
    int overlay = -1;  // index into overlays_ (slot and set unused)
  };
  void add_bf16(float** ptr, int64_t n);
  std::vector<Item> items_;
  std::vector<std::vector<Plan>> overlays_;
  Bf16Store* bf16_ = nullptr;
};

// One layer's activations kept in bf16 (model.saved_dtype=bf16, memory_policy.h). While a Plan sends its
// activations here (Plan::keep_activations_in), each fp32 activation buffer of a Saved is planned in
// `staging` (the model overlays the layers' stagings: the fp32 copy lives only while its layer runs) and
// its bf16 copy in the model's block. After the layer's forward, compress() rounds the fp32 values to bf16
// (nearest even); before its backward, expand() restores fp32 from them.
struct Bf16Store {
  struct Item {
    float** fp32;
    int64_t n;  // planned values
    uint16_t* bf16 = nullptr;
  };
  Plan staging;
  std::deque<Item> items;  // stable addresses: the block's plan holds &Item::bf16
  int64_t planned_tokens = 0;
  // The first `tokens` tokens' values of every item (the block may be planned for more).
  void compress(int64_t tokens) const;
  void expand(int64_t tokens) const;
  // The layers' staging plans, for one Plan::add_overlay (their fp32 buffers live one layer at a time).
  static std::vector<Plan> stagings(const std::vector<Bf16Store>& layers);
};

// The backward contract of every unit: the gradient w.r.t. the unit's input is ACCUMULATED into dx (as
// llm.c's backward passes and autograd's .grad do), and so are the parameter gradients.
//
// Explicit instantiation of a mixer unit (KdaUnit, AttentionUnit) for value type T.
#define OLMOSFT_MIXER_UNIT(U, T)                                                                          \
  template struct U::Saved<T>;                                                                            \
  template struct U::Scratch<T>;                                                                          \
  template void U::forward<T>(const Ctx<T>&, const T*, T*, const Saved<T>&, const Scratch<T>&) const;     \
  template void U::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, const T*, T*, const Scratch<T>&) \
      const;

// Residency group of every registry tensor (model.h ParamResidency): 0 = before block 0, 1 + l = block l,
// L + 1 = after the last block.
std::vector<int> residency_groups(const ModelConfig& c);

// The attention kernel's configuration for a [B, T] batch of a config's softmax attention (GQA, head_dim for
// q, k and v, scale 1/sqrt(head_dim)) with the given window (0 = full causal).
AttentionConfig attention_config(const ModelConfig& c, int64_t B, int64_t T, int64_t window);
// The attention kernel's workspace for a [B, T] batch: the larger of forward and backward, over the full
// and the sliding window, for value type T (fp32 by default), at the current thread count.
template <typename T = float>
size_t attention_workspace_bytes(const ModelConfig& c, int64_t B, int64_t T_);

// model.h activation_bytes of a model's workspace type W: W has a `policy` and a plan(c, N) that returns
// the unit::Plan it carves and sets W::saved_bytes.
template <typename W>
ActivationBytes planned_activations(const ModelConfig& c, int64_t B, int64_t T, const MemoryPolicy& policy) {
  W w;
  w.policy = policy;
  const Plan p = w.plan(c, B * T);
  ActivationBytes a;
  a.saved = w.saved_bytes;
  a.working = p.bytes() - w.saved_bytes;
  a.kernels = attention_workspace_bytes(c, B, T);
  return a;
}

}  // namespace olmosft::model::unit
