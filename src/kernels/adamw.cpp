#include "kernels/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/threads.h"

namespace olmosft {

void AdamWConfig::validate() const {
  OLMO_CHECK(std::isfinite(lr) && lr >= 0, "adamw: lr must be finite and >= 0, got ", lr);
  OLMO_CHECK(beta1 >= 0 && beta1 < 1, "adamw: beta1 must be in [0, 1), got ", beta1);
  OLMO_CHECK(beta2 >= 0 && beta2 < 1, "adamw: beta2 must be in [0, 1), got ", beta2);
  OLMO_CHECK(std::isfinite(eps) && eps >= 0, "adamw: eps must be finite and >= 0, got ", eps);
  OLMO_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
             "adamw: weight_decay must be finite and >= 0, got ", weight_decay);
}

namespace {
// The fixed blocking of one tensor's sum of squares: at most 64 blocks of at least 4,096 elements, so
// the sum does not depend on the thread count.
int64_t norm_blocks(int64_t n) { return std::max<int64_t>(1, std::min<int64_t>(64, n / 4096)); }

template <typename T>
std::vector<int64_t> sizes_of(const std::vector<AdamWParam<T>>& params) {
  std::vector<int64_t> n;
  for (const auto& P : params) n.push_back(P.n);
  return n;
}
}  // namespace

double sum_of_squares(const float* g, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += double(g[i + l]) * double(g[i + l]);
  for (int l = 0; i < n; ++i, ++l) s[l] += double(g[i]) * double(g[i]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

namespace {
// The float tensors' sum; double gradients (float64 checks) keep the plain sequential sum.
double sum_of_squares_of(const float* g, int64_t n) { return sum_of_squares(g, n); }
double sum_of_squares_of(const double* g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += g[i] * g[i];
  return s;
}
}  // namespace

template <typename T>
double global_grad_norm(const std::vector<AdamWParam<T>>& params) {
  std::vector<std::vector<double>> part(params.size());
  for (size_t t = 0; t < params.size(); ++t) {
    const auto& P = params[t];
    OLMO_CHECK(P.n >= 0 && (P.n == 0 || P.g), "global_grad_norm: tensor with n=", P.n, " has no gradient");
    part[t].assign(size_t(norm_blocks(P.n)), 0.0);
  }
  // One parallel region over all tensors: a block is summed whole by the thread whose share holds its
  // first element.
  parallel_for_ranges(sizes_of(params), [&](size_t t, int64_t lo, int64_t hi) {
    const auto& P = params[t];
    const int64_t B = int64_t(part[t].size());
    for (int64_t b = 0; b < B; ++b) {
      const int64_t first = P.n * b / B, last = P.n * (b + 1) / B;
      if (first < lo || first >= hi) continue;
      part[t][size_t(b)] = sum_of_squares_of(P.g + first, last - first);
    }
  });
  double total = 0;
  for (const auto& blocks : part)
    for (double s : blocks) total += s;
  return std::sqrt(total);
}

double clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
}

template <typename T>
double clip_grad_norm(std::vector<AdamWParam<T>>& params, double max_norm) {
  const double norm = global_grad_norm(params);
  OLMO_CHECK(std::isfinite(norm), "clip_grad_norm: the global gradient norm is not finite (", norm,
             "); a gradient contains NaN or inf");
  if (max_norm > 0) {
    const double coef = clip_coefficient(norm, max_norm);
    if (coef < 1.0) {
      const T c = T(coef);
      parallel_for_ranges(
          sizes_of(params),
          [&](size_t t, int64_t b, int64_t e) {
            T* g = params[t].g;
            for (int64_t i = b; i < e; ++i) g[i] *= c;
          },
          1 << 14);
    }
  }
  return norm;
}

template <typename T>
void adamw_step(std::vector<AdamWParam<T>>& params, const AdamWConfig& cfg, int64_t step, T grad_scale) {
  cfg.validate();
  OLMO_CHECK(step >= 1, "adamw_step: step must be >= 1 (1-based), got ", step);
  const double bc1 = 1.0 - std::pow(cfg.beta1, double(step));
  const double bc2 = 1.0 - std::pow(cfg.beta2, double(step));
  const T step_size = T(cfg.lr / bc1), bc2_sqrt = T(std::sqrt(bc2)), eps = T(cfg.eps);
  const T b1 = T(cfg.beta1), b2 = T(cfg.beta2), omb1 = T(1.0 - cfg.beta1), omb2 = T(1.0 - cfg.beta2);
  std::vector<T> keep(params.size());
  for (size_t t = 0; t < params.size(); ++t) {
    const auto& P = params[t];
    OLMO_CHECK(P.n >= 0 && (P.n == 0 || (P.p && P.g && P.m && P.v)), "adamw_step: tensor with n=", P.n,
               " is missing p, g, m or v");
    keep[t] = T(1.0 - cfg.lr * (P.decay ? cfg.weight_decay : 0.0));
  }
  // One parallel region over all tensors (parallel_for_ranges), each piece updated by the loop below.
  // Elementwise, so vector lanes give the same bits as the scalar loop: IEEE sqrt and division are
  // exact-rounded in both, and the fused multiply-adds are written out (the ones the compiler chose for the
  // scalar loop), so contraction cannot differ between the two. Pinned by
  // KernelsAdamW.LoopEqualsItsScalarFormulaBitwise.
  parallel_for_ranges(
      sizes_of(params),
      [&](size_t t, int64_t b, int64_t e) {
        T *p = params[t].p, *m = params[t].m, *v = params[t].v;
        const T* g = params[t].g;
        const T kp = keep[t];
#pragma omp simd
        for (int64_t i = b; i < e; ++i) {
          const T gi = g[i] * grad_scale;
          const T mi = std::fma(m[i], b1, gi * omb1);
          const T vi = std::fma(v[i], b2, (gi * gi) * omb2);
          const T denom = std::sqrt(vi) / bc2_sqrt + eps;
          const T pi = std::fma(-step_size, mi / denom, p[i] * kp);
          p[i] = pi;
          m[i] = mi;
          v[i] = vi;
        }
      },
      1 << 14);
}

template double global_grad_norm<float>(const std::vector<AdamWParam<float>>&);
template double global_grad_norm<double>(const std::vector<AdamWParam<double>>&);
template double clip_grad_norm<float>(std::vector<AdamWParam<float>>&, double);
template double clip_grad_norm<double>(std::vector<AdamWParam<double>>&, double);
template void adamw_step<float>(std::vector<AdamWParam<float>>&, const AdamWConfig&, int64_t, float);
template void adamw_step<double>(std::vector<AdamWParam<double>>&, const AdamWConfig&, int64_t, double);

}  // namespace olmosft
