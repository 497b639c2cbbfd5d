// Short causal depthwise convolution + SiLU with document-local windows (see kda.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/kda.h"

namespace olmosft::kda {

std::vector<int64_t> segment_starts(const int32_t* seg, int64_t B, int64_t L) {
  std::vector<int64_t> start(static_cast<size_t>(B * L));
  for (int64_t b = 0; b < B; ++b) {
    int64_t cur = 0;
    for (int64_t t = 0; t < L; ++t) {
      const int64_t i = b * L + t;
      if (seg && seg[i] < 0) {
        start[i] = -1;
        continue;
      }
      if (t == 0 || (seg && (seg[i] != seg[i - 1]))) cur = t;
      start[i] = cur;
    }
  }
  return start;
}

namespace {
template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// Channel blocks processed by one thread; all loops are token-major with the channel loop innermost.
constexpr int64_t kChanBlock = 64;

template <typename T>
void check_conv_args(int64_t B, int64_t L, int64_t C, int64_t K) {
  OLMO_CHECK(B >= 0 && L >= 0 && C > 0 && K > 0, "short_conv: bad shape B=", B, " L=", L, " C=", C, " K=", K);
}
}  // namespace

template <typename T>
void short_conv_silu_forward(const T* x, const T* w, const int32_t* seg, int64_t B, int64_t L, int64_t C,
                             int64_t K, T* y) {
  check_conv_args<T>(B, L, C, K);
  const std::vector<int64_t> start = segment_starts(seg, B, L);
  const int64_t nblk = (C + kChanBlock - 1) / kChanBlock;
  parallel_for(B * nblk, [&](int64_t lo, int64_t hi) {
    std::vector<T> wt(static_cast<size_t>(K * kChanBlock));  // [K, cb] transposed weight block
    for (int64_t it = lo; it < hi; ++it) {
      const int64_t b = it / nblk, c0 = (it % nblk) * kChanBlock, c1 = std::min(C, c0 + kChanBlock);
      const int64_t cb = c1 - c0;
      for (int64_t j = 0; j < K; ++j)
        for (int64_t c = 0; c < cb; ++c) wt[j * cb + c] = w[(c0 + c) * K + j];
      for (int64_t t = 0; t < L; ++t) {
        const int64_t i = b * L + t;
        T* yr = y + i * C + c0;
        if (start[i] < 0) {
          std::fill(yr, yr + cb, T(0));
          continue;
        }
        T acc[kChanBlock] = {};
        for (int64_t j = 0; j < K; ++j) {
          const int64_t s = t - (K - 1) + j;
          if (s < start[i]) continue;
          const T* xr = x + (b * L + s) * C + c0;
          const T* wr = wt.data() + j * cb;
          for (int64_t c = 0; c < cb; ++c) acc[c] += wr[c] * xr[c];
        }
        for (int64_t c = 0; c < cb; ++c) yr[c] = acc[c] * sigmoid(acc[c]);
      }
    }
  });
}

template <typename T>
void short_conv_silu_backward(const T* x, const T* w, const int32_t* seg, int64_t B, int64_t L, int64_t C,
                              int64_t K, const T* dy, T* dx, T* dw) {
  check_conv_args<T>(B, L, C, K);
  const std::vector<int64_t> start = segment_starts(seg, B, L);
  const int64_t nblk = (C + kChanBlock - 1) / kChanBlock;
  // Parallel over channel blocks only (dw is a reduction over rows and tokens).
  parallel_for(nblk, [&](int64_t lo, int64_t hi) {
    std::vector<T> wt(static_cast<size_t>(K * kChanBlock));
    std::vector<T> dwt(static_cast<size_t>(K * kChanBlock));
    std::vector<T> dpre(static_cast<size_t>(L * kChanBlock));  // d loss / d pre-activation, one row
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t c0 = blk * kChanBlock, c1 = std::min(C, c0 + kChanBlock), cb = c1 - c0;
      for (int64_t j = 0; j < K; ++j)
        for (int64_t c = 0; c < cb; ++c) wt[j * cb + c] = w[(c0 + c) * K + j];
      std::fill(dwt.begin(), dwt.end(), T(0));
      for (int64_t b = 0; b < B; ++b) {
        // Recompute the pre-activation and form dpre = dy * silu'(pre).
        for (int64_t t = 0; t < L; ++t) {
          const int64_t i = b * L + t;
          T* dp = dpre.data() + t * cb;
          if (start[i] < 0) {
            std::fill(dp, dp + cb, T(0));
            continue;
          }
          T acc[kChanBlock] = {};
          for (int64_t j = 0; j < K; ++j) {
            const int64_t s = t - (K - 1) + j;
            if (s < start[i]) continue;
            const T* xr = x + (b * L + s) * C + c0;
            for (int64_t c = 0; c < cb; ++c) acc[c] += wt[j * cb + c] * xr[c];
          }
          const T* dyr = dy + i * C + c0;
          for (int64_t c = 0; c < cb; ++c) {
            const T sg = sigmoid(acc[c]);
            dp[c] = dyr[c] * sg * (T(1) + acc[c] * (T(1) - sg));
          }
        }
        // dx[s] = sum_j dpre[s+K-1-j] * w[j] over targets in the same document; dw[j] += dpre[t] x[t-K+1+j].
        for (int64_t s = 0; s < L; ++s) {
          const int64_t i = b * L + s;
          T* dxr = dx + i * C + c0;
          std::fill(dxr, dxr + cb, T(0));
          if (start[i] < 0) continue;
          const T* xr = x + i * C + c0;
          for (int64_t j = 0; j < K; ++j) {
            const int64_t t = s + (K - 1) - j;
            if (t >= L || start[b * L + t] != start[i]) continue;
            const T* dp = dpre.data() + t * cb;
            const T* wr = wt.data() + j * cb;
            T* dwr = dwt.data() + j * cb;
            for (int64_t c = 0; c < cb; ++c) {
              dxr[c] += dp[c] * wr[c];
              dwr[c] += dp[c] * xr[c];
            }
          }
        }
      }
      for (int64_t j = 0; j < K; ++j)
        for (int64_t c = 0; c < cb; ++c) dw[(c0 + c) * K + j] += dwt[j * cb + c];
    }
  });
}

#define OLMOSFT_KDA_CONV(T)                                                                                \
  template void short_conv_silu_forward<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t,  \
                                           int64_t, T*);                                                   \
  template void short_conv_silu_backward<T>(const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, \
                                            int64_t, const T*, T*, T*);
OLMOSFT_KDA_CONV(float)
OLMOSFT_KDA_CONV(double)
#undef OLMOSFT_KDA_CONV

}  // namespace olmosft::kda
