// Latent mixture-of-experts FFN (Olmo 3.5 hybrid, docs/reference/architecture.md B.5/B.6/B.10), forward and
// backward.
//
//   logits = x Wr^T                      router on the FULL-width x ([N, E]; in T precision, fp32 for float)
//   p      = softmax(logits)             over all E experts
//   (s_j, e_j)_{j<k} = top-k of p        sorted by descending p, ties broken by the lower expert index
//   w_j    = k * s_j / sum_j s_j         (L1-normalised, restore_weight_scale; times weight_mult)
//   z      = x Wdown^T                   latent down projection [N, Lt] (Lt = d and z = x without latent)
//   r      = sum_j w_j * Expert_{e_j}(z)  Expert_e(z) = (silu(z G_e^T) * (z U_e^T)) D_e^T, in the latent
//   width out    = r Wup^T + Shared(x)         latent up projection, one shared SwiGLU expert on the
//   full-width x
//
// The experts run as per-expert GEMMs over the tokens routed to each one (tokens grouped by expert, one
// cblas GEMM per expert and projection: a grouped GEMM through OpenBLAS). The backward recomputes the
// expert activations from the saved latent z instead of storing them, so the saved state per layer is
// O(N * (E + d + Lt)) and does not grow with top_k * expert_hidden.
//
// Aux losses over the routed tokens (all tokens whose `valid` flag is set; N_r of them):
//   LB = (E/k) * sum_e c_e * mean_t(p_te) / N_r     (c_e = (token, slot) choices of expert e, no gradient)
//   Z  = sum_t logsumexp(logits_t)^2 / N_r
// Capacity (buffer factor bf > 0): capacity = ceil(bf * N_r * k / E) per expert; assignments are accepted
// in token order (token-major, then slot order) and those beyond an expert's capacity are dropped (their
// contribution is zero, their weight gets no gradient). c_e counts the router's choices before dropping.
// required_buffer_factor = max_e c_e / (N_r * k / E).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace olmosft::moe {

struct MoeDims {
  int64_t d = 0;              // model width
  int64_t experts = 0;        // E
  int64_t top_k = 0;          // k
  int64_t expert_hidden = 0;  // F (moe_intermediate_size)
  int64_t latent = 0;         // Lt (latent_moe_dim); 0 = experts run on x directly
  int64_t shared_hidden = 0;  // shared expert hidden width; 0 = no shared expert
  double weight_mult = 1.0;   // extra factor on the routed weights (sqrt(orig_k / k) when configured)
  double buffer_factor = -1;  // <= 0: dropless
};

// Weight pointers (nn.Linear [out, in] layout). gate/up/down are per expert (E entries each).
template <typename T>
struct MoeWeights {
  const T* router = nullptr;       // [E, d]
  const T* latent_down = nullptr;  // [Lt, d]   (unused when latent == 0)
  const T* latent_up = nullptr;    // [d, Lt]
  std::vector<const T*> gate, up;  // [F, Lt] each
  std::vector<const T*> down;      // [Lt, F] each
  const T* shared_gate = nullptr;  // [S, d]
  const T* shared_up = nullptr;    // [S, d]
  const T* shared_down = nullptr;  // [d, S]
};

// Gradient pointers, same layout; accumulated (+=). Any may be null to skip it.
template <typename T>
struct MoeGrads {
  T* router = nullptr;
  T* latent_down = nullptr;
  T* latent_up = nullptr;
  std::vector<T*> gate, up, down;
  T* shared_gate = nullptr;
  T* shared_up = nullptr;
  T* shared_down = nullptr;
};

struct MoeStats {
  double lb = 0;        // unweighted load-balance loss
  double router_z = 0;  // unweighted router z-loss
  double required_buffer_factor = 0;
  int64_t dropped = 0;  // dropped (token, slot) assignments
  int64_t routed_tokens = 0;
  std::vector<int64_t> loads;  // c_e (router choices per expert, before dropping)
};

// What the forward keeps for the backward.
template <typename T>
struct MoeCache {
  int64_t N = 0;
  std::vector<T> probs;        // [N, E] softmax (0 rows for invalid tokens)
  std::vector<T> lse;          // [N] router logsumexp
  std::vector<int32_t> topk;   // [N, k] expert ids (-1 for invalid tokens)
  std::vector<T> weights;      // [N, k] routed weights (0 for dropped assignments)
  std::vector<uint8_t> kept;   // [N, k]
  std::vector<T> z;            // [N, Lt] latent input (empty when latent == 0)
  std::vector<T> r;            // [N, Lt] routed output before the up projection
  std::vector<T> sh_a, sh_b;   // [N, S] shared expert gate / up pre-activations
  std::vector<T> sh_h;         // [N, S] shared expert hidden
  std::vector<int64_t> loads;  // c_e
  int64_t routed = 0;
  size_t bytes() const;
};

void validate(const MoeDims& d);

// x [N, d] -> out [N, d] (overwritten). valid: [N] flags (nullptr = every token is routed); tokens with
// valid == 0 (padding) are not routed (routed output 0) and take no part in the aux losses or capacity.
template <typename T>
MoeStats moe_forward(const MoeDims& dims, const MoeWeights<T>& w, const T* x, const uint8_t* valid, int64_t N,
                     T* out, MoeCache<T>& cache);

// Backward of  sum(dout * out) + lb_coef * LB + z_coef * Z.  dx [N, d] is ACCUMULATED (the units' contract).
template <typename T>
void moe_backward(const MoeDims& dims, const MoeWeights<T>& w, const MoeGrads<T>& g, const T* x,
                  const MoeCache<T>& cache, const T* dout, double lb_coef, double z_coef, T* dx);

// The bytes moe_forward / moe_backward allocate for N tokens (T = float unless elem says otherwise), for
// planning (train/plan.h). `parallel` experts are processed at once (the OpenMP threads of the expert loop;
// every expert for a grouped GEMM); each keeps a scratch of n_e rows for the largest expert it ran. Rows
// per expert: dropless (buffer_factor <= 0) the worst case n_e = N (a token picks an expert at most once),
// with a capacity n_e <= ceil(buffer_factor * N * k / E); in all, at most N * k assignments.
struct MoeWorkspace {
  size_t cache = 0;     // MoeCache::bytes(): kept from the forward to the backward
  size_t forward = 0;   // peak transient inside moe_forward, on top of the cache
  size_t backward = 0;  // peak transient inside moe_backward
  size_t transient() const { return forward > backward ? forward : backward; }
};
MoeWorkspace moe_workspace_bytes(const MoeDims& d, int64_t N, int64_t parallel, size_t elem = sizeof(float));

// Plain SwiGLU MLP (dense layer / shared expert): y = (silu(x Wg^T) * (x Wu^T)) Wd^T. a, b, h: [N, F]
// saved pre-activations and hidden. The backward ACCUMULATES into dx when accumulate_dx (else
// overwrites) and into dWg, dWu, dWd.
template <typename T>
void swiglu_mlp_forward(const T* x, const T* Wg, const T* Wu, const T* Wd, int64_t N, int64_t d, int64_t F,
                        T* a, T* b, T* h, T* y);
template <typename T>
void swiglu_mlp_backward(const T* x, const T* Wg, const T* Wu, const T* Wd, int64_t N, int64_t d, int64_t F,
                         const T* a, const T* b, const T* h, const T* dy, T* dx, T* dWg, T* dWu, T* dWd,
                         bool accumulate_dx);

}  // namespace olmosft::moe
