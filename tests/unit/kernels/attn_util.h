// Test helpers for the attention kernel: a naive float64 reference with a materialised T x T mask (defined
// from the segment ids directly, independently of the kernel's interval representation) and a small
// driver that runs the kernel with its workspace.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/attention.h"

namespace attn_test {

using olmosft::AttentionConfig;

template <typename T>
struct Grads {
  std::vector<T> o, lse, dq, dk, dv;
};

inline std::vector<double> randn(size_t n, uint64_t stream, double std = 1.0) {
  olmosft::Rng r{1234, stream};
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std * r.normal(i);
  return x;
}

// Segment ids from document lengths; a length given as -n appends n padding tokens (id -1).
inline std::vector<int32_t> segments(const std::vector<int>& lens) {
  std::vector<int32_t> s;
  int32_t id = 0;
  for (int l : lens) {
    if (l < 0)
      s.insert(s.end(), -l, -1);
    else
      s.insert(s.end(), l, id++);
  }
  return s;
}

inline bool visible(const AttentionConfig& c, const int32_t* seg, int64_t i, int64_t j) {
  return seg[i] >= 0 && seg[j] == seg[i] && j <= i && (c.window <= 0 || i - j < c.window);
}

// Naive float64 forward and backward (full softmax over a materialised mask).
inline Grads<double> naive(const AttentionConfig& c, const std::vector<double>& q,
                           const std::vector<double>& k, const std::vector<double>& v,
                           const std::vector<int32_t>& seg, const std::vector<double>& dout) {
  const int64_t B = c.batch, T = c.seq, H = c.heads, Hk = c.kv_heads, D = c.head_dim, Dv = c.v_head_dim;
  const int64_t G = H / Hk;
  Grads<double> g;
  g.o.assign(B * T * H * Dv, 0);
  g.lse.assign(B * H * T, -std::numeric_limits<double>::infinity());
  g.dq.assign(B * T * H * D, 0);
  g.dk.assign(B * T * Hk * D, 0);
  g.dv.assign(B * T * Hk * Dv, 0);
  std::vector<char> mask(T * T);
  std::vector<double> p(T), dp(T);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* sg = seg.data() + b * T;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) mask[i * T + j] = visible(c, sg, i, j);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / G;
      for (int64_t i = 0; i < T; ++i) {
        const double* qi = &q[((b * T + i) * H + h) * D];
        double mx = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          p[j] = 0;
          if (!mask[i * T + j]) continue;
          const double* kj = &k[((b * T + j) * Hk + kh) * D];
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qi[d] * kj[d];
          p[j] = s * c.scale;
          mx = std::max(mx, p[j]);
        }
        if (mx == -INFINITY) continue;  // padding row: o = 0, lse = -inf, no gradient
        double sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          p[j] = mask[i * T + j] ? std::exp(p[j] - mx) : 0;
          sum += p[j];
        }
        g.lse[(b * H + h) * T + i] = mx + std::log(sum);
        double* oi = &g.o[((b * T + i) * H + h) * Dv];
        const double* doi = &dout[((b * T + i) * H + h) * Dv];
        double pdp = 0;
        for (int64_t j = 0; j < T; ++j) {
          p[j] /= sum;
          dp[j] = 0;
          if (p[j] == 0) continue;
          const double* vj = &v[((b * T + j) * Hk + kh) * Dv];
          for (int64_t d = 0; d < Dv; ++d) {
            oi[d] += p[j] * vj[d];
            dp[j] += doi[d] * vj[d];
          }
          pdp += p[j] * dp[j];
        }
        for (int64_t j = 0; j < T; ++j) {
          if (p[j] == 0) continue;
          const double ds = p[j] * (dp[j] - pdp) * c.scale;
          const double* kj = &k[((b * T + j) * Hk + kh) * D];
          double* dkj = &g.dk[((b * T + j) * Hk + kh) * D];
          double* dvj = &g.dv[((b * T + j) * Hk + kh) * Dv];
          double* dqi = &g.dq[((b * T + i) * H + h) * D];
          for (int64_t d = 0; d < D; ++d) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
          for (int64_t d = 0; d < Dv; ++d) dvj[d] += p[j] * doi[d];
        }
      }
    }
  }
  return g;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

// Runs the kernel forward (+ backward when dout is non-empty) with freshly sized workspaces.
template <typename T>
Grads<T> run_kernel(const AttentionConfig& c, const std::vector<T>& q, const std::vector<T>& k,
                    const std::vector<T>& v, const std::vector<int32_t>& seg, const std::vector<T>& dout) {
  Grads<T> g;
  g.o.assign(c.batch * c.seq * c.heads * c.v_head_dim, T(0));
  g.lse.assign(c.batch * c.heads * c.seq, T(0));
  std::vector<std::byte> ws(olmosft::attention_forward_workspace_bytes<T>(c));
  olmosft::attention_forward<T>(c, q.data(), k.data(), v.data(), seg.data(), g.o.data(), g.lse.data(),
                                ws.data(), ws.size());
  if (dout.empty()) return g;
  g.dq.assign(q.size(), T(0));
  g.dk.assign(k.size(), T(0));
  g.dv.assign(v.size(), T(0));
  ws.assign(olmosft::attention_backward_workspace_bytes<T>(c), std::byte{0});
  olmosft::attention_backward<T>(c, q.data(), k.data(), v.data(), seg.data(), g.o.data(), g.lse.data(),
                                 dout.data(), g.dq.data(), g.dk.data(), g.dv.data(), ws.data(), ws.size());
  return g;
}

// max |a - b| / max(max |b|, floor): a norm-wise relative error that does not blow up on tiny entries.
template <typename A, typename B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b, double floor = 0.1) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    if (std::isinf(y) && x == y) continue;  // matching -inf (padding lse)
    num = std::max(num, std::abs(x - y));
    den = std::max(den, std::abs(y));
  }
  return num / den;
}

}  // namespace attn_test
