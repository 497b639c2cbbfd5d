// Reference token-by-token KDA recurrence (docs/reference/architecture.md C.1) and its reverse-time backward
// (C.2).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/kda.h"

namespace olmosft::kda {

namespace {

void check_dims(const KdaDims& d, const char* what) {
  OLMO_CHECK(d.B >= 0 && d.L >= 0 && d.H > 0 && d.K > 0 && d.V > 0, what, ": bad dims B=", d.B, " L=", d.L,
             " H=", d.H, " K=", d.K, " V=", d.V);
}

// One recurrence step on state S [K,V] (in place): decay, delta update. Returns nothing; u written.
template <typename T>
inline void step(T* S, const T* kt, const T* vt, const T* gt, T bt, int64_t K, int64_t V, T* u) {
  for (int64_t c = 0; c < K; ++c) {
    const T a = std::exp(gt[c]);
    T* row = S + c * V;
    for (int64_t j = 0; j < V; ++j) row[j] *= a;
  }
  for (int64_t j = 0; j < V; ++j) u[j] = 0;
  for (int64_t c = 0; c < K; ++c) {
    const T* row = S + c * V;
    const T kc = kt[c];
    for (int64_t j = 0; j < V; ++j) u[j] += row[j] * kc;
  }
  for (int64_t j = 0; j < V; ++j) u[j] = bt * (vt[j] - u[j]);
  for (int64_t c = 0; c < K; ++c) {
    T* row = S + c * V;
    const T kc = kt[c];
    for (int64_t j = 0; j < V; ++j) row[j] += kc * u[j];
  }
}

}  // namespace

template <typename T>
void kda_recurrent_forward(const T* q, const T* k, const T* v, const T* g, const T* beta, const int32_t* seg,
                           const KdaDims& d, T scale, T* o) {
  check_dims(d, "kda_recurrent_forward");
  const int64_t L = d.L, H = d.H, K = d.K, V = d.V;
  const std::vector<int64_t> start = segment_starts(seg, d.B, L);
  parallel_for(d.B * H, [&](int64_t lo, int64_t hi) {
    std::vector<T> S(static_cast<size_t>(K * V)), u(static_cast<size_t>(V));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      for (int64_t t = 0; t < L; ++t) {
        const int64_t n = (b * L + t) * H + h;  // (token, head) index
        T* ot = o + n * V;
        if (start[b * L + t] < 0) {
          std::fill(ot, ot + V, T(0));
          continue;
        }
        if (start[b * L + t] == t) std::fill(S.begin(), S.end(), T(0));
        step(S.data(), k + n * K, v + n * V, g + n * K, beta[n], K, V, u.data());
        const T* qt = q + n * K;
        for (int64_t j = 0; j < V; ++j) ot[j] = 0;
        for (int64_t c = 0; c < K; ++c) {
          const T qc = scale * qt[c];
          const T* row = S.data() + c * V;
          for (int64_t j = 0; j < V; ++j) ot[j] += row[j] * qc;
        }
      }
    }
  });
}

template <typename T>
void kda_recurrent_backward(const T* q, const T* k, const T* v, const T* g, const T* beta, const int32_t* seg,
                            const KdaDims& d, T scale, const T* dout, T* dq, T* dk, T* dv, T* dg, T* dbeta,
                            int64_t ckpt) {
  check_dims(d, "kda_recurrent_backward");
  OLMO_CHECK(ckpt > 0, "kda_recurrent_backward: checkpoint interval must be > 0, got ", ckpt);
  const int64_t L = d.L, H = d.H, K = d.K, V = d.V, KV = K * V;
  const std::vector<int64_t> start = segment_starts(seg, d.B, L);
  const int64_t nblk = (L + ckpt - 1) / ckpt;
  parallel_for(d.B * H, [&](int64_t lo, int64_t hi) {
    // ck[i]: state after token i*ckpt-1 (before block i). blk[j]: state after token j of the current block.
    std::vector<T> ck(static_cast<size_t>(nblk * KV)), blk(static_cast<size_t>((ckpt + 1) * KV));
    std::vector<T> G(static_cast<size_t>(KV)), Sp(static_cast<size_t>(KV)), u(static_cast<size_t>(V));
    std::vector<T> r(static_cast<size_t>(V)), du(static_cast<size_t>(V));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      auto idx = [&](int64_t t) { return (b * L + t) * H + h; };
      // Forward pass storing checkpoints.
      std::vector<T> S(static_cast<size_t>(KV), T(0));
      for (int64_t t = 0; t < L; ++t) {
        if (t % ckpt == 0) std::copy(S.begin(), S.end(), ck.begin() + (t / ckpt) * KV);
        if (start[b * L + t] < 0) continue;
        if (start[b * L + t] == t) std::fill(S.begin(), S.end(), T(0));
        const int64_t n = idx(t);
        step(S.data(), k + n * K, v + n * V, g + n * K, beta[n], K, V, u.data());
      }
      std::fill(G.begin(), G.end(), T(0));
      for (int64_t ib = nblk - 1; ib >= 0; --ib) {
        const int64_t t0 = ib * ckpt, t1 = std::min(L, t0 + ckpt);
        // Recompute the block's states: blk[0] = state before t0, blk[j+1] = state after t0+j.
        std::copy(ck.begin() + ib * KV, ck.begin() + (ib + 1) * KV, blk.begin());
        for (int64_t t = t0; t < t1; ++t) {
          T* Sn = blk.data() + (t - t0 + 1) * KV;
          std::copy(blk.begin() + (t - t0) * KV, blk.begin() + (t - t0 + 1) * KV, Sn);
          if (start[b * L + t] < 0) continue;
          if (start[b * L + t] == t) std::fill(Sn, Sn + KV, T(0));
          const int64_t n = idx(t);
          step(Sn, k + n * K, v + n * V, g + n * K, beta[n], K, V, u.data());
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const int64_t n = idx(t);
          if (start[b * L + t] < 0) {
            std::fill(dq + n * K, dq + (n + 1) * K, T(0));
            std::fill(dk + n * K, dk + (n + 1) * K, T(0));
            std::fill(dg + n * K, dg + (n + 1) * K, T(0));
            std::fill(dv + n * V, dv + (n + 1) * V, T(0));
            dbeta[n] = 0;
            continue;
          }
          const bool reset = start[b * L + t] == t;
          const T* St = blk.data() + (t - t0 + 1) * KV;
          const T* Sprev = blk.data() + (t - t0) * KV;
          const T *qt = q + n * K, *kt = k + n * K, *vt = v + n * V, *gt = g + n * K, *dot = dout + n * V;
          const T bt = beta[n];
          // S' = Diag(exp g) S_prev (zero at a document start); r = v - S'^T k; u = beta r.
          for (int64_t c = 0; c < K; ++c) {
            const T a = reset ? T(0) : std::exp(gt[c]);
            for (int64_t j = 0; j < V; ++j) Sp[c * V + j] = a * Sprev[c * V + j];
          }
          for (int64_t j = 0; j < V; ++j) r[j] = vt[j];
          for (int64_t c = 0; c < K; ++c)
            for (int64_t j = 0; j < V; ++j) r[j] -= Sp[c * V + j] * kt[c];
          for (int64_t j = 0; j < V; ++j) u[j] = bt * r[j];
          // G += q~ do^T;  dq = scale * S_t do.
          for (int64_t c = 0; c < K; ++c) {
            const T qc = scale * qt[c];
            T acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t j = 0; j < V; ++j) {
              G[c * V + j] += qc * dot[j];
              acc += St[c * V + j] * dot[j];
            }
            dq[n * K + c] = scale * acc;
          }
          // du = G^T k;  dv = beta du;  dbeta = r . du.
          for (int64_t j = 0; j < V; ++j) du[j] = 0;
          for (int64_t c = 0; c < K; ++c)
            for (int64_t j = 0; j < V; ++j) du[j] += G[c * V + j] * kt[c];
          T db = 0;
#pragma omp simd reduction(+ : db)
          for (int64_t j = 0; j < V; ++j) {
            dv[n * V + j] = bt * du[j];
            db += r[j] * du[j];
          }
          dbeta[n] = db;
          // dk = G u - beta S' du;  dS' = G - beta k du^T;  dg = rowsum(dS' . S');  G <- Diag(exp g) dS'.
          for (int64_t c = 0; c < K; ++c) {
            T acc = 0, accg = 0;
            const T a = reset ? T(0) : std::exp(gt[c]);
#pragma omp simd reduction(+ : acc, accg)
            for (int64_t j = 0; j < V; ++j) {
              acc += G[c * V + j] * u[j] - bt * Sp[c * V + j] * du[j];
              const T dsp = G[c * V + j] - bt * kt[c] * du[j];
              accg += dsp * Sp[c * V + j];
              G[c * V + j] = a * dsp;
            }
            dk[n * K + c] = acc;
            dg[n * K + c] = accg;
          }
        }
      }
    }
  });
}

#define OLMOSFT_KDA_REC(T)                                                                                  \
  template void kda_recurrent_forward<T>(const T*, const T*, const T*, const T*, const T*, const int32_t*,  \
                                         const KdaDims&, T, T*);                                            \
  template void kda_recurrent_backward<T>(const T*, const T*, const T*, const T*, const T*, const int32_t*, \
                                          const KdaDims&, T, const T*, T*, T*, T*, T*, T*, int64_t);
OLMOSFT_KDA_REC(float)
OLMOSFT_KDA_REC(double)
#undef OLMOSFT_KDA_REC

}  // namespace olmosft::kda
