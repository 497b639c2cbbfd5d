#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/threads.h"
#include "kernels/gemm.h"
#include "kernels/vexp.h"

namespace olmosft {

namespace {
struct Plan {
  std::vector<int64_t> rows;  // trained token indices
  int64_t chunk, block;
};

Plan make_plan(const int32_t* targets, const uint8_t* mask, int64_t N, int64_t d, int64_t V_rows,
               const XentConfig& cfg, const char* who) {
  OLMO_CHECK(N >= 0 && d > 0 && V_rows > 0, who, ": bad shape N=", N, " d=", d, " V_rows=", V_rows);
  OLMO_CHECK(cfg.valid_vocab > 0 && cfg.valid_vocab <= V_rows, who, ": valid_vocab=", cfg.valid_vocab,
             " must be in [1, V_rows=", V_rows, "]");
  OLMO_CHECK(cfg.vocab_chunk >= 0 && cfg.row_block >= 0, who, ": vocab_chunk/row_block must be >= 0");
  OLMO_CHECK(std::isfinite(cfg.z_loss) && cfg.z_loss >= 0, who, ": z_loss must be finite and >= 0, got ",
             cfg.z_loss);
  Plan p;
  for (int64_t i = 0; i < N; ++i) {
    if (mask && mask[i] == 0) continue;
    if (targets[i] == cfg.ignore_index) continue;
    OLMO_CHECK(targets[i] >= 0 && targets[i] < cfg.valid_vocab, who, ": target ", targets[i], " at token ", i,
               " is outside the vocabulary [0, ", cfg.valid_vocab, ") (ignore_index is ", cfg.ignore_index,
               ")");
    p.rows.push_back(i);
  }
  p.chunk = cfg.vocab_chunk == 0 ? cfg.valid_vocab : std::min(cfg.vocab_chunk, cfg.valid_vocab);
  p.block = cfg.row_block == 0
                ? std::max<int64_t>(1, int64_t(p.rows.size()))
                : std::min<int64_t>(cfg.row_block, std::max<int64_t>(1, int64_t(p.rows.size())));
  return p;
}

// Per-row softmax pieces. float: the vectorised exp and max of vexp.h (its path is chosen at run time; a
// row's result depends only on the row). double (the finite-difference path): std::exp, sequential.
float row_max(const float* l, int64_t n) { return vmax(l, n); }
double row_max(const double* l, int64_t n) {
  double m = l[0];
  for (int64_t j = 1; j < n; ++j) m = std::max(m, l[j]);
  return m;
}
// sum_j exp(l[j] - m), accumulated in double.
double sum_exp(const float* l, int64_t n, float m) { return vexp_sub_sum_f64(l, n, m); }
double sum_exp(const double* l, int64_t n, double m) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(l[j] - m);
  return s;
}
// l[j] = exp(l[j] - L) * k.
void exp_scale(float* l, int64_t n, float L, float k) { vexp_sub_scale(l, n, L, k); }
void exp_scale(double* l, int64_t n, double L, double k) {
  for (int64_t j = 0; j < n; ++j) l[j] = std::exp(l[j] - L) * k;
}

template <typename T>
void gather_rows(const T* h, int64_t d, const int64_t* rows, int64_t nr, T* out) {
  parallel_for(
      nr,
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) std::copy(h + rows[r] * d, h + rows[r] * d + d, out + r * d);
      },
      16);
}

// The vocabulary tiles of one row block hb [nr, d]: per chunk [c0, c0 + nc) of the vocabulary, the logits
// l [nr, nc] = hb W[c0 : c0 + nc]^T, then row(r, l + r * nc, c0, nc) for every row (rows in parallel), then
// after(c0, nc).
template <typename T, typename Row, typename After>
void vocab_tiles(const Plan& p, int64_t V, int64_t d, const T* W, const T* hb, int64_t nr, T* l, Row row,
                 After after) {
  for (int64_t c0 = 0; c0 < V; c0 += p.chunk) {
    const int64_t nc = std::min(p.chunk, V - c0);
    gemm_compute<T>(Precision::Compute, Trans::N, Trans::T, nr, nc, d, T(1), hb, d, W + c0 * d, d, T(0), l,
                    nc);
    parallel_for(
        nr,
        [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) row(r, l + r * nc, c0, nc);
        },
        4);
    after(c0, nc);
  }
}
}  // namespace

size_t xent_workspace_bytes(int64_t trained, int64_t d, const XentConfig& cfg, size_t elem) {
  OLMO_CHECK(trained >= 0 && d > 0 && cfg.valid_vocab > 0 && cfg.vocab_chunk >= 0 && cfg.row_block >= 0,
             "xent_workspace_bytes: bad sizes trained=", trained, " d=", d, " valid_vocab=", cfg.valid_vocab);
  const int64_t V = cfg.valid_vocab;
  const int64_t chunk = cfg.vocab_chunk == 0 ? V : std::min(cfg.vocab_chunk, V);
  const int64_t all = std::max<int64_t>(1, trained);
  const int64_t block = cfg.row_block == 0 ? all : std::min(cfg.row_block, all);
  // make_plan's row list grows by push_back: its capacity is at most twice the rows (libstdc++ doubles).
  const size_t rows = size_t(2 * trained) * sizeof(int64_t);
  const size_t fwd = size_t(block * d + block * chunk) * elem + size_t(3 * block) * sizeof(double);
  const size_t bwd = size_t(2 * block * d + block * chunk) * elem;
  return rows + std::max(fwd, bwd);
}

template <typename T>
XentStats xent_forward(const T* h, const T* W, const int32_t* targets, const uint8_t* mask, int64_t N,
                       int64_t d, int64_t V_rows, const XentConfig& cfg, T* lse) {
  Plan p = make_plan(targets, mask, N, d, V_rows, cfg, "xent_forward");
  const int64_t V = cfg.valid_vocab, nt = int64_t(p.rows.size());
  for (int64_t i = 0; i < N; ++i) lse[i] = T(0);
  std::vector<T> hb(size_t(p.block * d)), logits(size_t(p.block * p.chunk));
  std::vector<double> run_max(size_t(p.block)), run_sum(size_t(p.block)), tgt(size_t(p.block));
  XentStats st;
  st.count = nt;
  for (int64_t r0 = 0; r0 < nt; r0 += p.block) {
    const int64_t nr = std::min(p.block, nt - r0);
    const int64_t* rows = p.rows.data() + r0;
    gather_rows(h, d, rows, nr, hb.data());
    std::fill(run_max.begin(), run_max.end(), -std::numeric_limits<double>::infinity());
    std::fill(run_sum.begin(), run_sum.end(), 0.0);
    vocab_tiles(
        p, V, d, W, hb.data(), nr, logits.data(),
        [&](int64_t r, const T* l, int64_t c0, int64_t nc) {
          const T m = row_max(l, nc);
          const double m_new = std::max(run_max[size_t(r)], double(m));
          const double s = sum_exp(l, nc, T(m_new));
          run_sum[size_t(r)] = run_sum[size_t(r)] * std::exp(run_max[size_t(r)] - m_new) + s;
          run_max[size_t(r)] = m_new;
          const int64_t t = targets[rows[r]];
          if (t >= c0 && t < c0 + nc) tgt[size_t(r)] = double(l[t - c0]);
        },
        [](int64_t, int64_t) {});
    for (int64_t r = 0; r < nr; ++r) {
      const double L = run_max[size_t(r)] + std::log(run_sum[size_t(r)]);
      lse[rows[r]] = T(L);
      st.ce_sum += L - tgt[size_t(r)];
      st.z_sum += L * L;
    }
  }
  return st;
}

template <typename T>
void xent_backward(const T* h, const T* W, const int32_t* targets, const uint8_t* mask, const T* lse,
                   int64_t N, int64_t d, int64_t V_rows, const XentConfig& cfg, double scale, T* dh, T* dW) {
  Plan p = make_plan(targets, mask, N, d, V_rows, cfg, "xent_backward");
  OLMO_CHECK(std::isfinite(scale), "xent_backward: scale must be finite, got ", scale);
  const int64_t V = cfg.valid_vocab, nt = int64_t(p.rows.size());
  if (dh)
    for (int64_t i = 0; i < N * d; ++i) dh[i] = T(0);
  if (!dh && !dW) return;
  std::vector<T> hb(size_t(p.block * d)), g(size_t(p.block * p.chunk)), dhb(dh ? size_t(p.block * d) : 0);
  for (int64_t r0 = 0; r0 < nt; r0 += p.block) {
    const int64_t nr = std::min(p.block, nt - r0);
    const int64_t* rows = p.rows.data() + r0;
    gather_rows(h, d, rows, nr, hb.data());
    vocab_tiles(
        p, V, d, W, hb.data(), nr, g.data(),
        [&](int64_t r, T* l, int64_t c0, int64_t nc) {  // the logits' gradient, in place
          const T L = lse[rows[r]];
          const T k = T(scale * (1.0 + 2.0 * cfg.z_loss * double(L))), sc = T(scale);
          exp_scale(l, nc, L, k);
          const int64_t t = targets[rows[r]];
          if (t >= c0 && t < c0 + nc) l[t - c0] -= sc;
        },
        [&](int64_t c0, int64_t nc) {
          if (dh)
            gemm_compute<T>(Precision::Compute, Trans::N, Trans::N, nr, d, nc, T(1), g.data(), nc, W + c0 * d,
                            d, c0 == 0 ? T(0) : T(1), dhb.data(), d);
          if (dW)
            gemm_compute<T>(Precision::Compute, Trans::T, Trans::N, nc, d, nr, T(1), g.data(), nc, hb.data(),
                            d, T(1), dW + c0 * d, d);
        });
    if (dh)
      for (int64_t r = 0; r < nr; ++r)
        std::copy(dhb.data() + r * d, dhb.data() + r * d + d, dh + rows[r] * d);
  }
}

template XentStats xent_forward<float>(const float*, const float*, const int32_t*, const uint8_t*, int64_t,
                                       int64_t, int64_t, const XentConfig&, float*);
template XentStats xent_forward<double>(const double*, const double*, const int32_t*, const uint8_t*, int64_t,
                                        int64_t, int64_t, const XentConfig&, double*);
template void xent_backward<float>(const float*, const float*, const int32_t*, const uint8_t*, const float*,
                                   int64_t, int64_t, int64_t, const XentConfig&, double, float*, float*);
template void xent_backward<double>(const double*, const double*, const int32_t*, const uint8_t*,
                                    const double*, int64_t, int64_t, int64_t, const XentConfig&, double,
                                    double*, double*);

namespace {
struct XDims {
  int64_t N, d, V;
};
XDims xent_check(const Tensor& h, const Tensor& W, const Tensor& targets, const Tensor& mask,
                 const Tensor& lse, const char* who) {
  OLMO_CHECK(h.defined() && W.defined() && targets.defined() && lse.defined(), who,
             ": h, W, targets and lse are required");
  const DType dt = h.dtype();
  OLMO_CHECK(dt == DType::F32 || dt == DType::F64, who, ": h must be F32/F64, got ", dtype_name(dt));
  OLMO_CHECK(h.ndim() == 2 && h.is_contiguous(), who, ": h must be a contiguous [N, d] matrix, got ",
             shape_str(h.shape()));
  OLMO_CHECK(W.ndim() == 2 && W.is_contiguous() && W.dtype() == dt && W.size(1) == h.size(1), who,
             ": W must be a contiguous [V_rows, ", h.size(1), "] ", dtype_name(dt), " matrix, got ",
             shape_str(W.shape()), " ", dtype_name(W.dtype()));
  const int64_t N = h.size(0);
  OLMO_CHECK(targets.dtype() == DType::I32 && targets.is_contiguous() && targets.shape() == Shape{N}, who,
             ": targets must be contiguous I32 [", N, "], got ", shape_str(targets.shape()), " ",
             dtype_name(targets.dtype()));
  if (mask.defined())
    OLMO_CHECK(mask.dtype() == DType::U8 && mask.is_contiguous() && mask.shape() == Shape{N}, who,
               ": mask must be contiguous U8 [", N, "], got ", shape_str(mask.shape()), " ",
               dtype_name(mask.dtype()));
  OLMO_CHECK(lse.dtype() == dt && lse.is_contiguous() && lse.shape() == Shape{N}, who,
             ": lse must be contiguous ", dtype_name(dt), " [", N, "], got ", shape_str(lse.shape()));
  return {N, h.size(1), W.size(0)};
}
}  // namespace

XentStats xent_forward(const Tensor& h, const Tensor& W, const Tensor& targets, const Tensor& mask,
                       const XentConfig& cfg, Tensor& lse) {
  auto D = xent_check(h, W, targets, mask, lse, "xent_forward");
  const uint8_t* m = mask.defined() ? mask.data<uint8_t>() : nullptr;
  if (h.dtype() == DType::F32)
    return xent_forward<float>(h.data<float>(), W.data<float>(), targets.data<int32_t>(), m, D.N, D.d, D.V,
                               cfg, lse.data<float>());
  return xent_forward<double>(h.data<double>(), W.data<double>(), targets.data<int32_t>(), m, D.N, D.d, D.V,
                              cfg, lse.data<double>());
}

void xent_backward(const Tensor& h, const Tensor& W, const Tensor& targets, const Tensor& mask,
                   const Tensor& lse, const XentConfig& cfg, double scale, Tensor& dh, Tensor& dW) {
  auto D = xent_check(h, W, targets, mask, lse, "xent_backward");
  if (dh.defined())
    OLMO_CHECK(dh.dtype() == h.dtype() && dh.is_contiguous() && dh.shape() == h.shape(),
               "xent_backward: dh must match h ", shape_str(h.shape()), ", got ", shape_str(dh.shape()));
  if (dW.defined())
    OLMO_CHECK(dW.dtype() == W.dtype() && dW.is_contiguous() && dW.shape() == W.shape(),
               "xent_backward: dW must match W ", shape_str(W.shape()), ", got ", shape_str(dW.shape()));
  const uint8_t* m = mask.defined() ? mask.data<uint8_t>() : nullptr;
  if (h.dtype() == DType::F32)
    xent_backward<float>(h.data<float>(), W.data<float>(), targets.data<int32_t>(), m, lse.data<float>(), D.N,
                         D.d, D.V, cfg, scale, dh.defined() ? dh.data<float>() : nullptr,
                         dW.defined() ? dW.data<float>() : nullptr);
  else
    xent_backward<double>(h.data<double>(), W.data<double>(), targets.data<int32_t>(), m, lse.data<double>(),
                          D.N, D.d, D.V, cfg, scale, dh.defined() ? dh.data<double>() : nullptr,
                          dW.defined() ? dW.data<double>() : nullptr);
}

}  // namespace olmosft
