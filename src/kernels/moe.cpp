// Latent MoE FFN forward/backward (see moe.h).
#include "kernels/moe.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#include "kernels/swiglu.h"

namespace olmosft::moe {

namespace {

// Below this many elements of work a loop runs on one thread: on a loaded machine the OpenMP fork/join
// of a tiny region costs more than the work (measured: the tiny fixture ran 15x slower with 2 threads).
constexpr int64_t kParallelMin = 1 << 16;

// Per-expert GEMMs run in an OpenMP loop over experts; BLAS is single-threaded inside it.

// Assignment slots (t * k + j) kept for each expert, in token order.
std::vector<std::vector<int64_t>> group_by_expert(const std::vector<int32_t>& topk,
                                                  const std::vector<uint8_t>& kept, int64_t E) {
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));
  for (size_t s = 0; s < topk.size(); ++s)
    if (kept[s]) rows[static_cast<size_t>(topk[s])].push_back(static_cast<int64_t>(s));
  return rows;
}

// One expert's routed slots `re` (of k per token): their tokens' rows of zin [N, Lt] gathered into Z, and
// its SwiGLU forward on them (A, B, H: [n, F]; Ye: [n, Lt]). The buffers keep their capacity per thread.
template <typename T>
struct ExpertRun {
  std::vector<T> Z, A, B, H, Ye;
  void forward(const T* zin, const std::vector<int64_t>& re, int64_t k, int64_t Lt, int64_t F, const T* gate,
               const T* up, const T* down) {
    const int64_t n = static_cast<int64_t>(re.size());
    Z.resize(static_cast<size_t>(n * Lt));
    A.resize(static_cast<size_t>(n * F));
    B.resize(A.size());
    H.resize(A.size());
    Ye.resize(Z.size());
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(zin + (re[static_cast<size_t>(i)] / k) * Lt, Lt, Z.data() + i * Lt);
    swiglu_mlp_forward(Z.data(), gate, up, down, n, Lt, F, A.data(), B.data(), H.data(), Ye.data());
  }
};

}  // namespace

void validate(const MoeDims& d) {
  OLMO_CHECK(d.d > 0, "moe: d must be > 0, got ", d.d);
  OLMO_CHECK(d.experts > 0, "moe: experts must be > 0, got ", d.experts);
  OLMO_CHECK(d.top_k > 0 && d.top_k <= d.experts, "moe: top_k must be in [1, experts=", d.experts, "], got ",
             d.top_k);
  OLMO_CHECK(d.expert_hidden > 0, "moe: expert_hidden must be > 0, got ", d.expert_hidden);
  OLMO_CHECK(d.latent >= 0 && d.shared_hidden >= 0, "moe: latent and shared_hidden must be >= 0");
  OLMO_CHECK(std::isfinite(d.weight_mult) && d.weight_mult > 0, "moe: weight_mult must be finite and > 0");
  OLMO_CHECK(std::isfinite(d.buffer_factor), "moe: buffer_factor must be finite (-1 = dropless)");
}

template <typename T>
size_t MoeCache<T>::bytes() const {
  size_t n = (probs.size() + lse.size() + weights.size() + z.size() + r.size() + sh_a.size() + sh_b.size() +
              sh_h.size()) *
             sizeof(T);
  return n + topk.size() * sizeof(int32_t) + kept.size() + loads.size() * sizeof(int64_t);
}

MoeWorkspace moe_workspace_bytes(const MoeDims& dims, int64_t N, int64_t parallel, size_t elem) {
  validate(dims);
  OLMO_CHECK(N >= 0 && parallel >= 1, "moe_workspace_bytes: N must be >= 0 and parallel >= 1, got N=", N,
             " parallel=", parallel);
  const auto n = [](int64_t v) { return static_cast<size_t>(v); };
  const int64_t d = dims.d, E = dims.experts, k = dims.top_k, F = dims.expert_hidden, S = dims.shared_hidden;
  const int64_t Lt = dims.latent > 0 ? dims.latent : d, lat = dims.latent > 0 ? Lt : 0;
  int64_t per_expert = N;  // dropless: a token routes to an expert at most once
  if (dims.buffer_factor > 0)
    per_expert = std::min<int64_t>(
        N, static_cast<int64_t>(
               std::ceil(dims.buffer_factor * static_cast<double>(N * k) / static_cast<double>(E) - 1e-9)));
  const int64_t rows =
      std::min(parallel * per_expert, N * k);  // scratch rows held by the expert loop at once
  MoeWorkspace w;
  // MoeCache: probs, lse, weights, z, r, shared a/b/h (T); topk (int32), kept (uint8), loads (int64).
  w.cache = n(N * E + N + N * k + N * lat + N * Lt + 3 * N * S) * elem + n(N * k) * 4 + n(N * k) + n(E) * 8;
  const size_t groups = n(N * k) * sizeof(int64_t);  // group_by_expert's slot lists
  // Forward: router logits, grouped slots, Y [N*k, Lt], then the expert scratch (Z, A, B, H, Ye per row) or
  // the shared expert's output.
  w.forward = n(N * E + N * k * Lt) * elem + groups +
              std::max(n(rows * (3 * F + 2 * Lt)), S > 0 ? n(N * d) : size_t(0)) * elem;
  // Backward: dr, dw, dZs, grouped slots; then the expert scratch (Z, A, B, H, Ye, dYe, dZ and the SwiGLU
  // backward's dh, da, db per row), or dz with the shared expert's backward (dh, da, db) / the router's dlog.
  w.backward = n(N * lat + N * k + N * k * Lt) * elem + groups +
               std::max(n(rows * (6 * F + 4 * Lt)), n(N * Lt + std::max(3 * N * S, N * E))) * elem;
  return w;
}

template <typename T>
void swiglu_mlp_forward(const T* x, const T* Wg, const T* Wu, const T* Wd, int64_t N, int64_t d, int64_t F,
                        T* a, T* b, T* h, T* y) {
  linear_forward(x, Wg, a, N, d, F);
  linear_forward(x, Wu, b, N, d, F);
  swiglu_forward(a, b, h, N * F);
  linear_forward(h, Wd, y, N, F, d);
}

template <typename T>
void swiglu_mlp_backward(const T* x, const T* Wg, const T* Wu, const T* Wd, int64_t N, int64_t d, int64_t F,
                         const T* a, const T* b, const T* h, const T* dy, T* dx, T* dWg, T* dWu, T* dWd,
                         bool accumulate_dx) {
  std::vector<T> dh(static_cast<size_t>(N * F)), da(dh.size()), db(dh.size());
  linear_backward(dy, h, Wd, dh.data(), dWd, N, F, d);
  swiglu_backward(dh.data(), a, b, da.data(), db.data(), N * F);
  linear_backward(da.data(), x, Wg, dx, dWg, N, d, F, accumulate_dx);
  linear_backward(db.data(), x, Wu, dx, dWu, N, d, F, true);
}

template <typename T>
MoeStats moe_forward(const MoeDims& dims, const MoeWeights<T>& w, const T* x, const uint8_t* valid, int64_t N,
                     T* out, MoeCache<T>& c) {
  validate(dims);
  const int64_t d = dims.d, E = dims.experts, k = dims.top_k, F = dims.expert_hidden, S = dims.shared_hidden;
  const int64_t Lt = dims.latent > 0 ? dims.latent : d;
  OLMO_CHECK(static_cast<int64_t>(w.gate.size()) == E && static_cast<int64_t>(w.up.size()) == E &&
                 static_cast<int64_t>(w.down.size()) == E,
             "moe: expected ", E, " expert weight pointers");
  c = MoeCache<T>{};
  c.N = N;
  c.probs.assign(static_cast<size_t>(N * E), T(0));
  c.lse.assign(static_cast<size_t>(N), T(0));
  c.topk.assign(static_cast<size_t>(N * k), -1);
  c.weights.assign(static_cast<size_t>(N * k), T(0));
  c.kept.assign(static_cast<size_t>(N * k), 0);
  c.loads.assign(static_cast<size_t>(E), 0);

  // Router in T precision (fp32 for the float model) on the full-width x.
  std::vector<T> logits(static_cast<size_t>(N * E));
  linear_forward(x, w.router, logits.data(), N, d, E, Precision::Exact);
  int64_t routed = 0;
  for (int64_t t = 0; t < N; ++t) routed += (valid == nullptr || valid[t]) ? 1 : 0;
  c.routed = routed;
  MoeStats st;
  st.routed_tokens = routed;
  double zsum = 0;
#pragma omp parallel for reduction(+ : zsum) schedule(static) if (N * E >= kParallelMin)
  for (int64_t t = 0; t < N; ++t) {
    if (valid != nullptr && !valid[t]) continue;
    const T* lg = logits.data() + t * E;
    T* p = c.probs.data() + t * E;
    double m = lg[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, static_cast<double>(lg[e]));
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(static_cast<double>(lg[e]) - m);
    const double lse = m + std::log(s);
    c.lse[static_cast<size_t>(t)] = static_cast<T>(lse);
    zsum += lse * lse;
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<T>(std::exp(static_cast<double>(lg[e]) - lse));
    // top-k by descending p, ties by the lower expert index (deterministic).
    std::vector<int32_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double ssum = 0;
    for (int64_t j = 0; j < k; ++j) ssum += p[idx[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = idx[static_cast<size_t>(j)];
      c.topk[static_cast<size_t>(t * k + j)] = e;
      c.weights[static_cast<size_t>(t * k + j)] =
          static_cast<T>(dims.weight_mult * static_cast<double>(k) * p[e] / ssum);
    }
  }
  for (int64_t s = 0; s < N * k; ++s)
    if (c.topk[static_cast<size_t>(s)] >= 0) ++c.loads[static_cast<size_t>(c.topk[static_cast<size_t>(s)])];
  // Capacity: accept in token order, drop beyond capacity.
  int64_t capacity = -1;
  if (dims.buffer_factor > 0)
    capacity = static_cast<int64_t>(
        std::ceil(dims.buffer_factor * static_cast<double>(routed * k) / static_cast<double>(E) - 1e-9));
  std::vector<int64_t> accepted(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < N * k; ++s) {
    const int32_t e = c.topk[static_cast<size_t>(s)];
    if (e < 0) continue;
    if (capacity >= 0 && accepted[static_cast<size_t>(e)] >= capacity) {
      ++st.dropped;
      continue;
    }
    ++accepted[static_cast<size_t>(e)];
    c.kept[static_cast<size_t>(s)] = 1;
  }
  if (routed > 0) {
    double lb = 0;
    for (int64_t e = 0; e < E; ++e) {
      double pm = 0;
      for (int64_t t = 0; t < N; ++t) pm += c.probs[static_cast<size_t>(t * E + e)];
      lb += static_cast<double>(c.loads[static_cast<size_t>(e)]) * pm / static_cast<double>(routed);
    }
    st.lb = static_cast<double>(E) / static_cast<double>(k) * lb / static_cast<double>(routed);
    st.router_z = zsum / static_cast<double>(routed);
    const int64_t maxload = *std::max_element(c.loads.begin(), c.loads.end());
    st.required_buffer_factor =
        static_cast<double>(maxload) / (static_cast<double>(routed * k) / static_cast<double>(E));
  }
  st.loads = c.loads;

  // Latent down projection.
  const T* zin = x;
  if (dims.latent > 0) {
    c.z.resize(static_cast<size_t>(N * Lt));
    linear_forward(x, w.latent_down, c.z.data(), N, d, Lt);
    zin = c.z.data();
  }
  // Experts over their grouped tokens.
  auto rows = group_by_expert(c.topk, c.kept, E);
  std::vector<T> Y(static_cast<size_t>(N * k * Lt), T(0));
  {
    BlasSingleThread single;
#pragma omp parallel if (N * k * F >= kParallelMin)
    {
      ExpertRun<T> ex;
#pragma omp for schedule(dynamic)
      for (int64_t e = 0; e < E; ++e) {
        const auto& re = rows[static_cast<size_t>(e)];
        const int64_t n = static_cast<int64_t>(re.size());
        if (n == 0) continue;
        const size_t ei = static_cast<size_t>(e);
        ex.forward(zin, re, k, Lt, F, w.gate[ei], w.up[ei], w.down[ei]);
        for (int64_t i = 0; i < n; ++i)
          std::copy_n(ex.Ye.data() + i * Lt, Lt, Y.data() + re[static_cast<size_t>(i)] * Lt);
      }
    }
  }
  c.r.assign(static_cast<size_t>(N * Lt), T(0));
#pragma omp parallel for schedule(static) if (N * k * Lt >= kParallelMin)
  for (int64_t t = 0; t < N; ++t) {
    T* rt = c.r.data() + t * Lt;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j;
      if (!c.kept[static_cast<size_t>(s)]) continue;
      const T wj = c.weights[static_cast<size_t>(s)];
      const T* y = Y.data() + s * Lt;
      for (int64_t i = 0; i < Lt; ++i) rt[i] += wj * y[i];
    }
  }
  if (dims.latent > 0)
    linear_forward(c.r.data(), w.latent_up, out, N, Lt, d);
  else
    std::copy(c.r.begin(), c.r.end(), out);
  if (S > 0) {
    c.sh_a.resize(static_cast<size_t>(N * S));
    c.sh_b.resize(c.sh_a.size());
    c.sh_h.resize(c.sh_a.size());
    std::vector<T> ys(static_cast<size_t>(N * d));
    swiglu_mlp_forward(x, w.shared_gate, w.shared_up, w.shared_down, N, d, S, c.sh_a.data(), c.sh_b.data(),
                       c.sh_h.data(), ys.data());
    for (size_t i = 0; i < ys.size(); ++i) out[i] += ys[i];
  }
  return st;
}

template <typename T>
void moe_backward(const MoeDims& dims, const MoeWeights<T>& w, const MoeGrads<T>& g, const T* x,
                  const MoeCache<T>& c, const T* dout, double lb_coef, double z_coef, T* dx) {
  validate(dims);
  const int64_t N = c.N, d = dims.d, E = dims.experts, k = dims.top_k, F = dims.expert_hidden,
                S = dims.shared_hidden;
  const int64_t Lt = dims.latent > 0 ? dims.latent : d;
  auto pick = [](const std::vector<T*>& v, int64_t e) {
    return v.empty() ? nullptr : v[static_cast<size_t>(e)];
  };

  // d r = dout Wup.
  std::vector<T> dr;
  const T* drp = dout;
  if (dims.latent > 0) {
    dr.resize(static_cast<size_t>(N * Lt));
    linear_backward(dout, c.r.data(), w.latent_up, dr.data(), g.latent_up, N, Lt, d);
    drp = dr.data();
  }
  const T* zin = dims.latent > 0 ? c.z.data() : x;
  auto rows = group_by_expert(c.topk, c.kept, E);
  std::vector<T> dw(static_cast<size_t>(N * k), T(0));
  std::vector<T> dZs(static_cast<size_t>(N * k * Lt), T(0));
  {
    BlasSingleThread single;
#pragma omp parallel if (N * k * F >= kParallelMin)
    {
      ExpertRun<T> ex;
      std::vector<T> dYe, dZ;
#pragma omp for schedule(dynamic)
      for (int64_t e = 0; e < E; ++e) {
        const auto& re = rows[static_cast<size_t>(e)];
        const int64_t n = static_cast<int64_t>(re.size());
        if (n == 0) continue;
        const T* Ge = w.gate[static_cast<size_t>(e)];
        const T* Ue = w.up[static_cast<size_t>(e)];
        const T* De = w.down[static_cast<size_t>(e)];
        ex.forward(zin, re, k, Lt, F, Ge, Ue, De);  // the routed activations, recomputed
        dYe.resize(ex.Z.size());
        dZ.resize(ex.Z.size());
        const std::vector<T>& Ye = ex.Ye;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t s = re[static_cast<size_t>(i)];
          const T* drt = drp + (s / k) * Lt;
          const T* y = Ye.data() + i * Lt;
          double acc = 0;
          for (int64_t j = 0; j < Lt; ++j) acc += static_cast<double>(drt[j]) * y[j];
          dw[static_cast<size_t>(s)] = static_cast<T>(acc);
          const T ws = c.weights[static_cast<size_t>(s)];
          for (int64_t j = 0; j < Lt; ++j) dYe[static_cast<size_t>(i * Lt + j)] = ws * drt[j];
        }
        swiglu_mlp_backward(ex.Z.data(), Ge, Ue, De, n, Lt, F, ex.A.data(), ex.B.data(), ex.H.data(),
                            dYe.data(), dZ.data(), pick(g.gate, e), pick(g.up, e), pick(g.down, e), false);
        for (int64_t i = 0; i < n; ++i)
          std::copy_n(dZ.data() + i * Lt, Lt, dZs.data() + re[static_cast<size_t>(i)] * Lt);
      }
    }
  }
  // dz per token = sum over its kept slots.
  std::vector<T> dz(static_cast<size_t>(N * Lt), T(0));
#pragma omp parallel for schedule(static) if (N * k * Lt >= kParallelMin)
  for (int64_t t = 0; t < N; ++t) {
    T* o = dz.data() + t * Lt;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j;
      if (!c.kept[static_cast<size_t>(s)]) continue;
      const T* src = dZs.data() + s * Lt;
      for (int64_t i = 0; i < Lt; ++i) o[i] += src[i];
    }
  }
  if (dims.latent > 0)
    linear_backward(dz.data(), x, w.latent_down, dx, g.latent_down, N, d, Lt, true);
  else
    for (size_t i = 0; i < dz.size(); ++i) dx[i] += dz[i];
  if (S > 0)
    swiglu_mlp_backward(x, w.shared_gate, w.shared_up, w.shared_down, N, d, S, c.sh_a.data(), c.sh_b.data(),
                        c.sh_h.data(), dout, dx, g.shared_gate, g.shared_up, g.shared_down, true);

  // Router: through the selected p (L1 normalisation), the load-balance loss and the z-loss.
  std::vector<T> dlog(static_cast<size_t>(N * E), T(0));
  if (c.routed > 0) {
    const double Nr = static_cast<double>(c.routed);
    std::vector<double> lbgrad(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      lbgrad[static_cast<size_t>(e)] = lb_coef * static_cast<double>(E) / static_cast<double>(k) *
                                       static_cast<double>(c.loads[static_cast<size_t>(e)]) / (Nr * Nr);
#pragma omp parallel for schedule(static) if (N * k * Lt >= kParallelMin)
    for (int64_t t = 0; t < N; ++t) {
      if (c.topk[static_cast<size_t>(t * k)] < 0) continue;
      const T* p = c.probs.data() + t * E;
      std::vector<double> dp(lbgrad);
      double ssum = 0, dws = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double s = p[c.topk[static_cast<size_t>(t * k + j)]];
        ssum += s;
        dws += static_cast<double>(dw[static_cast<size_t>(t * k + j)]) * s;
      }
      const double mk = dims.weight_mult * static_cast<double>(k);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = c.topk[static_cast<size_t>(t * k + j)];
        dp[static_cast<size_t>(e)] +=
            mk * (static_cast<double>(dw[static_cast<size_t>(t * k + j)]) / ssum - dws / (ssum * ssum));
      }
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += dp[static_cast<size_t>(e)] * p[e];
      const double zc = z_coef * 2.0 * static_cast<double>(c.lse[static_cast<size_t>(t)]) / Nr;
      T* dl = dlog.data() + t * E;
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<T>(p[e] * (dp[static_cast<size_t>(e)] - dot + zc));
    }
  }
  linear_backward(dlog.data(), x, w.router, dx, g.router, N, d, E, true, Precision::Exact);
}

#define OLMOSFT_MOE_INST(T)                                                                                  \
  template struct MoeCache<T>;                                                                               \
  template MoeStats moe_forward<T>(const MoeDims&, const MoeWeights<T>&, const T*, const uint8_t*, int64_t,  \
                                   T*, MoeCache<T>&);                                                        \
  template void moe_backward<T>(const MoeDims&, const MoeWeights<T>&, const MoeGrads<T>&, const T*,          \
                                const MoeCache<T>&, const T*, double, double, T*);                           \
  template void swiglu_mlp_forward<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, T*, \
                                      T*, T*, T*);                                                           \
  template void swiglu_mlp_backward<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,    \
                                       const T*, const T*, const T*, const T*, T*, T*, T*, T*, bool);
OLMOSFT_MOE_INST(float)
OLMOSFT_MOE_INST(double)

}  // namespace olmosft::moe
