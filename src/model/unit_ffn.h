// FFN units (docs/reference/architecture.md A.3, B.5, B.6): the dense SwiGLU MLP (every Olmo 3 layer, the
// hybrid's dense layers) and the latent MoE. Both map x [N, d] -> f [N, d]; both backwards ACCUMULATE into dx
// (unit.h).
//
// SwiGluUnit:  f = (SiLU(x Wg^T) * (x Wu^T)) Wd^T. Parameters mlp.gate_proj, mlp.up_proj, mlp.down_proj;
//   hidden size from the layer spec (Olmo 3's intermediate_size, the hybrid's dense_mlp_intermediate_size).
//   Saves the gate and up pre-activations (2 F floats per token); the backward recomputes the hidden
//   product into scratch. Scratch (shared by all layers): act, dact [N, F].
// MoeUnit:  router softmax, top-k, optional latent down/up projection, routed SwiGLU experts, optional
//   shared expert (moe::moe_*). Parameters mlp.router.gate, mlp.latent_down_proj / latent_up_proj,
//   mlp.experts.<e>.{gate,up,down}_proj, mlp.shared_expert.{gate,up,down}_proj. Saves moe::MoeCache (router
//   probabilities and logsumexp, top-k ids, weights and kept flags, latent input and routed output, the
//   shared expert's pre-activations and hidden); the routed experts' hidden activations are recomputed
//   in the backward (moe.cpp). The cache's vectors are sized inside moe.cpp (kept per layer by the model,
//   so their capacity is reused from call to call). Its forward also returns the layer's load-balance /
//   router-z statistics.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "model/moe_capacity_emit.h"
#include "model/unit.h"
#include "model/unit_emit.h"

namespace olmosft::model::unit {

struct SwiGluUnit {
  int gate = -1, up = -1, down = -1;
  int64_t hidden = 0;  // F

  template <typename T>
  struct Saved {
    T *a, *b;  // gate / up pre-activations [N, F]
    void plan(Plan& p, int64_t F, int64_t N) {
      for (T** x : {&a, &b}) p.add_activation(x, N * F);
    }
  };
  template <typename T>
  struct Scratch {
    T *act, *dact;  // [N, F] for the largest F of the layers
    void plan(Plan& p, int64_t F, int64_t N) {
      for (T** x : {&act, &dact}) p.add(x, N * F);
    }
  };

  // Declares (or resolves, unit.h Params) its tensors under PREFIX ("model.layers.<l>.mlp." or a shared
  // expert's), in HF order, with hidden size F.
  void params(Params& p, const ModelConfig& c, const std::string& prefix, int64_t F);
  static int64_t saved_floats_per_token(int64_t F) { return 2 * F; }
  // FLOPs (train/flops.cpp): weight elements of the per-token GEMMs: gate, up, down.
  static double gemm_weights_per_token(const ModelConfig& c, int64_t F) {
    return 3.0 * static_cast<double>(c.hidden_size) * static_cast<double>(F);
  }

  template <typename T>
  void forward(const Ctx<T>& ctx, const T* x, T* f, const Saved<T>& s, const Scratch<T>& w) const;
  // df -> dx (ACCUMULATED).
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* df, T* dx,
                const Scratch<T>& w) const;

  // XLA (unit_emit.h): the graph keeps the gate and up pre-activations, as Saved.
  struct Emitted {
    std::optional<xla::Value> a, b;
  };
  xla::Value emit_forward(Emit& e, const xla::Value& x, Emitted& s) const;
  xla::Value emit_backward(Emit& e, const xla::Value& x, const Emitted& s, const xla::Value& df) const;
};

struct MoeUnit {
  int router = -1, ldown = -1, lup = -1, sh_g = -1, sh_u = -1, sh_d = -1;
  std::vector<int> eg, eu, ed;  // per routed expert

  template <typename T>
  struct Saved {
    moe::MoeCache<T> cache;
    // The layer's weight / gradient pointer tables, refilled on each call (their capacity kept).
    mutable moe::MoeWeights<T> w;
    mutable moe::MoeGrads<T> g;
    size_t bytes() const { return cache.bytes(); }
  };

  // Declares (or resolves, unit.h Params) its tensors under PREFIX = "model.layers.<l>.mlp.", in HF order.
  void params(Params& p, const ModelConfig& c, const std::string& prefix);
  // Upper bound (dropless): probs E, lse 1, top-k ids / weights / kept 3k, latent 2 Lt, shared 3 S.
  static int64_t saved_floats_per_token(const ModelConfig& c);
  // FLOPs (train/flops.cpp): weight elements of the GEMMs every token runs (router, latent projections,
  // shared expert) and of those each routed (token, expert) assignment runs (the expert's SwiGLU);
  // num_experts_per_tok assignments per token.
  static double gemm_weights_per_token(const ModelConfig& c);
  static double gemm_weights_per_routed(const ModelConfig& c);

  template <typename T>
  moe::MoeStats forward(const Ctx<T>& ctx, const T* x, T* f, Saved<T>& s) const;
  // df -> dx (ACCUMULATED); the auxiliary losses' gradients use ctx.loss coefficients * ctx.aux_scale.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* df, T* dx) const;

  // XLA (unit_emit.h), the same math as moe::moe_forward / moe_backward. Dropless (moe.buffer_factor <= 0)
  // in DENSE form: every routed expert runs on every token (its three GEMMs batched over the experts as one
  // [N, E*F] GEMM each) and its output is weighted by the token's routing weight, 0 for an expert the token
  // did not select (E/k times the expert FLOPs of a sparse dispatch; a dropless buffer would be as large).
  // With a capacity (LossConfig::moe_buffer_factor > 0) SPARSE: each expert runs on a buffer of its kept
  // assignments only, the kernel's capacity and drops (moe_capacity_emit.h). Top-k is k rounds of argmax
  // (ties: the lower expert index, as the kernel). Appends the layer's statistics to Emit::moe_stats
  // ([4]: LB, router z, required buffer factor, dropped assignments); the backward reads Emit::aux_scale.
  struct Emitted {
    std::optional<xla::Value> valid;      // f32 [N] 1 = routed token (segment >= 0)
    std::optional<xla::Value> p, lse;     // router softmax [N, E] (0 rows for padding), logsumexp [N]
    std::optional<xla::Value> sel, ssum;  // top-k mask [N, E] (0 / 1), sum of the selected p [N]
    std::optional<xla::Value> wts;        // routing weights [N, E]
    std::optional<xla::Value> loads, nr;  // c_e [E], max(routed tokens, 1) (f32 scalar)
    std::optional<xla::Value> z, a, b;    // latent input [N, Lt]; expert gate / up pre-activations [N, E*F]
    std::optional<xla::Value> r;          // routed output before the latent up projection [N, Lt]
    std::optional<xla::Value> idx;        // the chosen experts s32 [N, k]
    // moe.buffer_factor > 0: the assignments' buffer rows; a, b are then the buffers' [E, Cb, F]
    std::optional<moe_emit::Dispatch> disp;
    // the same over a mesh (moe_mesh_emit.h: experts split over the devices): the capacity (f32 scalar); a,
    // b are then the buffers [E, Cb, F] split over E
    std::optional<xla::Value> cap;
    SwiGluUnit::Emitted shared;
  };
  xla::Value emit_forward(Emit& e, const xla::Value& x, Emitted& s) const;
  xla::Value emit_backward(Emit& e, const xla::Value& x, const Emitted& s, const xla::Value& df) const;
};

}  // namespace olmosft::model::unit
