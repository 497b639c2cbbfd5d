// FFN units of the hybrid (docs/reference/architecture.md B.5, B.6): the dense SwiGLU MLP of the dense layers
// and the latent MoE of the others. Both map x [N, d] -> f [N, d].
//
// SwiGluMlpUnit:  f = (SiLU(x Wg^T) * (x Wu^T)) Wd^T  (moe::swiglu_mlp_*). Parameters mlp.gate_proj,
//   mlp.up_proj, mlp.down_proj. Saves the gate and up pre-activations and the hidden product (3 F floats
//   per token); recomputes nothing.
// RecomputedSwiGluMlpUnit (Olmo 3, fp32):  the same SwiGLU MLP with mlp.gate_proj / up_proj / down_proj,
//   saving only the gate and up pre-activations (2 F floats per token); the backward recomputes the
//   hidden product into scratch. Scratch (shared by all layers): act, dact [N, F].
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
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "model/unit.h"

namespace olmosft::model::unit {

struct SwiGluMlpUnit {
  int gate = -1, up = -1, down = -1;

  template <typename T>
  struct Saved {
    T *a, *b, *h;  // gate / up pre-activations, hidden [N, F]
    void plan(Plan& p, const ModelConfig& c, int64_t N) {
      for (T** x : {&a, &b, &h}) p.add_activation(x, N * c.dense_mlp_intermediate_size);
    }
  };

  // prefix = "model.layers.<l>.mlp."
  static SwiGluMlpUnit resolve(const ParamIndex& idx, const std::string& prefix);
  static int64_t saved_floats_per_token(const ModelConfig& c) { return 3 * c.dense_mlp_intermediate_size; }

  template <typename T>
  void forward(const Ctx<T>& ctx, const T* x, T* f, const Saved<T>& s) const;
  // df -> dx (overwritten).
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* df, T* dx) const;
};

struct RecomputedSwiGluMlpUnit {
  int gate = -1, up = -1, down = -1;

  struct Saved {
    float *a, *b;  // gate / up pre-activations
    void plan(Plan& p, const ModelConfig& c, int64_t N);
  };
  struct Scratch {
    float *act, *dact;
    void plan(Plan& p, const ModelConfig& c, int64_t N);
  };

  // prefix = "model.layers.<l>.mlp."
  static RecomputedSwiGluMlpUnit resolve(const ParamIndex& idx, const std::string& prefix);
  static int64_t saved_floats_per_token(const ModelConfig& c) { return 2 * c.intermediate_size; }

  // x [N, d] -> m [N, d] (overwritten).
  void forward(const Ctx<float>& ctx, const float* x, float* m, Saved& s, Scratch& w) const;
  // dm -> dx (ACCUMULATED).
  void backward(const Ctx<float>& ctx, const float* x, const Saved& s, const float* dm, float* dx,
                Scratch& w) const;
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

  static MoeUnit resolve(const ParamIndex& idx, const std::string& prefix, const ModelConfig& c);
  // Upper bound (dropless): probs E, lse 1, top-k ids / weights / kept 3k, latent 2 Lt, shared 3 S.
  static int64_t saved_floats_per_token(const ModelConfig& c);

  template <typename T>
  moe::MoeStats forward(const Ctx<T>& ctx, const T* x, T* f, Saved<T>& s) const;
  // df -> dx (overwritten); the auxiliary losses' gradients use ctx.loss coefficients * ctx.aux_scale.
  template <typename T>
  void backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* df, T* dx) const;
};

}  // namespace olmosft::model::unit
