// KDA gate (log-space per-channel decay), beta, and the gated output RMSNorm (see kda.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/threads.h"
#include "kernels/kda.h"

namespace olmosft::kda {

namespace {
template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
// torch.nn.functional.softplus(x) with beta = 1, threshold = 20.
template <typename T>
inline T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}
template <typename T>
inline T softplus_grad(T x) {
  return x > T(20) ? T(1) : sigmoid(x);
}
}  // namespace

template <typename T>
void kda_gate_forward(const T* f, const T* A_log, const T* dt_bias, int64_t N, int64_t H, int64_t K, T* g) {
  const int64_t HK = H * K;
  parallel_for(
      N,
      [&](int64_t lo, int64_t hi) {
        for (int64_t n = lo; n < hi; ++n)
          for (int64_t h = 0; h < H; ++h) {
            const T a = -std::exp(A_log[h]);
            for (int64_t c = 0; c < K; ++c) {
              const int64_t i = n * HK + h * K + c;
              g[i] = a * softplus(f[i] + dt_bias[h * K + c]);
            }
          }
      },
      64);
}

// g = a * sp(f + dtb), a = -exp(A_log):  df = dg * a * sigmoid(f + dtb);  ddtb = sum_n df;
// dA_log = sum dg * g (d a / d A_log = a).
template <typename T>
void kda_gate_backward(const T* f, const T* A_log, const T* dt_bias, const T* dg, int64_t N, int64_t H,
                       int64_t K, T* df, T* dA_log, T* ddt_bias) {
  const int64_t HK = H * K;
  // Parallel over heads (reductions into dA_log[h], ddt_bias[h*K..]) are then race-free.
  parallel_for(H, [&](int64_t lo, int64_t hi) {
    std::vector<T> acc_b(static_cast<size_t>(K));
    for (int64_t h = lo; h < hi; ++h) {
      const T a = -std::exp(A_log[h]);
      T acc_a = 0;
      std::fill(acc_b.begin(), acc_b.end(), T(0));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < K; ++c) {
          const int64_t i = n * HK + h * K + c;
          const T x = f[i] + dt_bias[h * K + c];
          const T d = dg[i] * a * softplus_grad(x);
          df[i] = d;
          acc_b[c] += d;
          acc_a += dg[i] * a * softplus(x);
        }
      dA_log[h] += acc_a;
      for (int64_t c = 0; c < K; ++c) ddt_bias[h * K + c] += acc_b[c];
    }
  });
}

template <typename T>
void kda_beta_forward(const T* b, int64_t n, bool allow_neg_eigval, T* beta) {
  const T m = allow_neg_eigval ? T(2) : T(1);
  for (int64_t i = 0; i < n; ++i) beta[i] = m * sigmoid(b[i]);
}

template <typename T>
void kda_beta_backward(const T* b, const T* dbeta, int64_t n, bool allow_neg_eigval, T* db) {
  const T m = allow_neg_eigval ? T(2) : T(1);
  for (int64_t i = 0; i < n; ++i) {
    const T s = sigmoid(b[i]);
    db[i] = dbeta[i] * m * s * (T(1) - s);
  }
}

template <typename T>
void kda_output_norm_forward(const T* o, const T* z, const T* w, int64_t N, int64_t D, T eps, T* y,
                             GateAct act) {
  const bool silu = act == GateAct::Silu;
  parallel_for(
      N,
      [&](int64_t lo, int64_t hi) {
        for (int64_t n = lo; n < hi; ++n) {
          const T* orow = o + n * D;
          T ss = 0;
          for (int64_t i = 0; i < D; ++i) ss += orow[i] * orow[i];
          const T r = T(1) / std::sqrt(ss / T(D) + eps);
          for (int64_t i = 0; i < D; ++i) {
            const T zi = z[n * D + i];
            y[n * D + i] = orow[i] * r * w[i] * (silu ? zi * sigmoid(zi) : sigmoid(zi));
          }
        }
      },
      64);
}

// nh = o r, a = nh w, y = a act(z):  dz = dy a act'(z);  da = dy act(z);  dw += da nh;
// dnh = da w;  do = r (dnh - nh mean(dnh nh)).
template <typename T>
void kda_output_norm_backward(const T* o, const T* z, const T* w, const T* dy, int64_t N, int64_t D, T eps,
                              T* dout, T* dz, T* dw, GateAct act) {
  const bool silu = act == GateAct::Silu;
  // dw partial sums over a fixed blocking of the rows (independent of the thread count and of which thread
  // finishes first), added to dw in block order: bit-identical results from run to run. (Adding per-thread
  // partials under a mutex in arrival order made dw, which accumulates across micro-batches, differ in the
  // last bits between runs.)
  const int64_t P = std::max<int64_t>(1, std::min<int64_t>(16, N / 64));
  std::vector<T> part(static_cast<size_t>(P * D), T(0));
  parallel_for(P, [&](int64_t pb, int64_t pe) {
    std::vector<T> dnh(static_cast<size_t>(D));
    for (int64_t p = pb; p < pe; ++p) {
      T* dwl = part.data() + p * D;
      for (int64_t n = N * p / P; n < N * (p + 1) / P; ++n) {
        const T* orow = o + n * D;
        T ss = 0;
        for (int64_t i = 0; i < D; ++i) ss += orow[i] * orow[i];
        const T r = T(1) / std::sqrt(ss / T(D) + eps);
        T dot = 0;
        for (int64_t i = 0; i < D; ++i) {
          const int64_t k = n * D + i;
          const T zk = z[k], s = sigmoid(zk);
          const T nh = orow[i] * r;
          const T a = nh * w[i];
          dz[k] = silu ? dy[k] * a * (s * (T(1) + zk * (T(1) - s))) : dy[k] * a * s * (T(1) - s);
          const T da = dy[k] * (silu ? zk * s : s);
          dwl[i] += da * nh;
          dnh[i] = da * w[i];
          dot += dnh[i] * nh;
        }
        dot /= T(D);
        for (int64_t i = 0; i < D; ++i) dout[n * D + i] = r * (dnh[i] - orow[i] * r * dot);
      }
    }
  });
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < D; ++i) dw[i] += part[static_cast<size_t>(p * D + i)];
}

#define OLMOSFT_KDA_GATE(T)                                                                                  \
  template void kda_gate_forward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, T*);            \
  template void kda_gate_backward<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, T*,  \
                                     T*, T*);                                                                \
  template void kda_beta_forward<T>(const T*, int64_t, bool, T*);                                            \
  template void kda_beta_backward<T>(const T*, const T*, int64_t, bool, T*);                                 \
  template void kda_output_norm_forward<T>(const T*, const T*, const T*, int64_t, int64_t, T, T*, GateAct);  \
  template void kda_output_norm_backward<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, T, T*, \
                                            T*, T*, GateAct);
OLMOSFT_KDA_GATE(float)
OLMOSFT_KDA_GATE(double)
#undef OLMOSFT_KDA_GATE

}  // namespace olmosft::kda
