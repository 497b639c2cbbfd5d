#include "kernels/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/rng.h"
#include "kernels/adamw.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace olmosft {

std::vector<double> fd_gradient(const std::function<double()>& loss, double* x, int64_t n, double h) {
  std::vector<double> fd(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    fd[static_cast<size_t>(i)] = (lp - lm) / (2 * h);
  }
  return fd;
}

double fd_max_rel_err(const std::function<double()>& loss, double* x, int64_t n, const double* analytic,
                      double h, double floor) {
  const std::vector<double> fd = fd_gradient(loss, x, n, h);
  double max_err = 0, max_an = 0;
  for (int64_t i = 0; i < n; ++i) {
    max_err = std::max(max_err, std::abs(fd[static_cast<size_t>(i)] - analytic[i]));
    max_an = std::max(max_an, std::abs(analytic[i]));
  }
  return max_err / std::max(max_an, floor);
}

namespace {
std::vector<double> randn(int64_t n, uint64_t seed, double scale = 1.0) {
  Rng r{seed, 0};
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * r.normal(uint64_t(i));
  return v;
}
double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
std::string dims(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::ostringstream os;
  bool first = true;
  for (auto& [k, v] : kv) {
    os << (first ? "" : " ") << k << "=" << v;
    first = false;
  }
  return os.str();
}
// FD tolerance: central differences in float64 with h = 1e-5 have truncation error ~h^2 * f''' ~ 1e-10
// and rounding error ~1e-16 * |L| / h ~ 1e-11 relative to O(1) gradients; 1e-6 leaves ample margin
// while any real bug (a missing term, a wrong sign, a transposed index) gives errors >= 1e-3.
constexpr double kFdTol = 1e-6;

KernelCheck check_linear() {
  const int64_t N = 5, in = 7, out = 4;
  auto x = randn(N * in, 1), W = randn(out * in, 2, 0.5), r = randn(N * out, 3);
  std::vector<double> y(static_cast<size_t>(N * out)), dx(static_cast<size_t>(N * in)),
      dW(static_cast<size_t>(out * in), 0.0);
  auto loss = [&] {
    linear_forward<double>(x.data(), W.data(), y.data(), N, in, out);
    return dot(y, r);
  };
  linear_backward<double>(r.data(), x.data(), W.data(), dx.data(), dW.data(), N, in, out);
  double e = std::max(fd_max_rel_err(loss, x.data(), N * in, dx.data()),
                      fd_max_rel_err(loss, W.data(), out * in, dW.data()));
  return {"linear (sgemm/dgemm) dX, dW", e, kFdTol, dims({{"N", N}, {"in", in}, {"out", out}})};
}

KernelCheck check_rmsnorm(bool weight) {
  const int64_t N = 4, D = 12;
  const double eps = 1e-6;
  auto x = randn(N * D, 11, 1.5), w = randn(D, 12, 0.3), r = randn(N * D, 13);
  for (auto& v : w) v += 1.0;
  std::vector<double> y(static_cast<size_t>(N * D)), dx(static_cast<size_t>(N * D)),
      dw(static_cast<size_t>(D), 0.0);
  const double* wp = weight ? w.data() : nullptr;
  auto loss = [&] {
    rmsnorm_forward<double>(x.data(), wp, y.data(), nullptr, N, D, eps);
    return dot(y, r);
  };
  rmsnorm_backward<double>(r.data(), x.data(), wp, nullptr, dx.data(), weight ? dw.data() : nullptr, N, D,
                           eps);
  double e = fd_max_rel_err(loss, x.data(), N * D, dx.data());
  if (weight) e = std::max(e, fd_max_rel_err(loss, w.data(), D, dw.data()));
  return {weight ? "rmsnorm (weight) dx, dw" : "rmsnorm (no weight) dx", e, kFdTol,
          dims({{"N", N}, {"D", D}}) + " eps=1e-6"};
}

KernelCheck check_swiglu() {
  const int64_t n = 64;
  auto a = randn(n, 21, 3.0), b = randn(n, 22), r = randn(n, 23);
  std::vector<double> h(static_cast<size_t>(n)), da(static_cast<size_t>(n)), db(static_cast<size_t>(n));
  auto loss = [&] {
    swiglu_forward<double>(a.data(), b.data(), h.data(), n);
    return dot(h, r);
  };
  swiglu_backward<double>(r.data(), a.data(), b.data(), da.data(), db.data(), n);
  double e =
      std::max(fd_max_rel_err(loss, a.data(), n, da.data()), fd_max_rel_err(loss, b.data(), n, db.data()));
  return {"swiglu da, db", e, kFdTol, dims({{"n", n}})};
}

KernelCheck check_rope() {
  // D.1 tiny config: head_dim 16, YaRN factor 8 (recomputed 512/64), ramp [0, .5, 1, ...].
  RopeConfig cfg;
  cfg.rope_type = "yarn";
  cfg.theta = 500000;
  cfg.head_dim = 16;
  cfg.max_position_embeddings = 512;
  cfg.factor = 8;
  cfg.original_max_position_embeddings = 64;
  cfg.attention_factor = 1.2079441541679836;
  const RopeFreqs f = rope_frequencies(cfg);
  const int64_t T = 6, H = 2, D = 16;
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 300};  // two packed documents
  std::vector<double> cs(size_t(T * D / 2)), sn(size_t(T * D / 2));
  rope_tables<double>(f, pos.data(), T, cs.data(), sn.data());
  auto x = randn(T * H * D, 31), r = randn(T * H * D, 32);
  std::vector<double> y(x.size()), dx = r;
  auto loss = [&] {
    y = x;
    rope_forward<double>(y.data(), cs.data(), sn.data(), T, H, D, H * D);
    return dot(y, r);
  };
  rope_backward<double>(dx.data(), cs.data(), sn.data(), T, H, D, H * D);
  double e = fd_max_rel_err(loss, x.data(), T * H * D, dx.data());
  return {"rope (yarn, packed positions) dx", e, kFdTol, dims({{"T", T}, {"H", H}, {"D", D}})};
}

KernelCheck check_xent() {
  const int64_t N = 6, d = 5, V_rows = 23;
  XentConfig cfg;
  cfg.valid_vocab = 20;  // 3 padded rows
  cfg.z_loss = 0.05;
  cfg.vocab_chunk = 7;  // tiled: 3 chunks, the last partial
  cfg.row_block = 2;
  auto h = randn(N * d, 41), W = randn(V_rows * d, 42, 0.7);
  const std::vector<int32_t> tgt = {3, 19, -100, 0, 7, 12};
  const std::vector<uint8_t> mask = {1, 1, 1, 0, 1, 1};
  const double scale = 1.0 / 4.0;
  std::vector<double> lse(static_cast<size_t>(N)), dh(static_cast<size_t>(N * d)),
      dW(static_cast<size_t>(V_rows * d), 0.0);
  auto loss = [&] {
    XentStats s =
        xent_forward<double>(h.data(), W.data(), tgt.data(), mask.data(), N, d, V_rows, cfg, lse.data());
    return scale * (s.ce_sum + cfg.z_loss * s.z_sum);
  };
  loss();
  xent_backward<double>(h.data(), W.data(), tgt.data(), mask.data(), lse.data(), N, d, V_rows, cfg, scale,
                        dh.data(), dW.data());
  double e = std::max(fd_max_rel_err(loss, h.data(), N * d, dh.data()),
                      fd_max_rel_err(loss, W.data(), V_rows * d, dW.data()));
  return {"softmax CE + z-loss (tiled) dh, dW", e, kFdTol,
          dims({{"N", N}, {"d", d}, {"V_rows", V_rows}, {"valid", 20}, {"chunk", 7}})};
}

KernelCheck check_adamw() {
  // Not differentiable: checks the first step against its closed form. At t = 1, m_hat = g and
  // v_hat = g^2, so p1 = p0 (1 - lr wd) - lr g / (|g| + eps); the clip scales g by max_norm / norm.
  const int64_t n = 9;
  auto p = randn(n, 51), g = randn(n, 52, 3.0);
  std::vector<double> m(static_cast<size_t>(n), 0.0), v(static_cast<size_t>(n), 0.0), p0 = p, g0 = g;
  std::vector<AdamWParam<double>> ps = {{p.data(), g.data(), m.data(), v.data(), n, true}};
  AdamWConfig c;
  c.lr = 0.01;
  c.weight_decay = 0.1;
  c.beta2 = 0.95;
  const double norm = clip_grad_norm(ps, 1.0);
  adamw_step(ps, c, 1);
  double ref_norm = std::sqrt(dot(g0, g0)), e = std::abs(norm - ref_norm) / ref_norm;
  const double coef = std::min(1.0, 1.0 / (ref_norm + 1e-6));
  for (int64_t i = 0; i < n; ++i) {
    const double gi = g0[size_t(i)] * coef;
    const double ref = p0[size_t(i)] * (1 - c.lr * c.weight_decay) - c.lr * gi / (std::abs(gi) + c.eps);
    e = std::max(e, std::abs(p[size_t(i)] - ref) / c.lr);
  }
  return {"clip + adamw step 1 (closed form)", e, 1e-12, dims({{"n", n}}) + " (error relative to lr)"};
}
}  // namespace

std::vector<KernelCheck> kernel_gradchecks() {
  return {check_linear(), check_rmsnorm(true), check_rmsnorm(false), check_swiglu(),
          check_rope(),   check_xent(),        check_adamw()};
}

}  // namespace olmosft
