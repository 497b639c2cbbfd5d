#include "kernels/rmsnorm.h"

#include <cmath>
#include <vector>

#include "core/threads.h"

namespace olmosft {

namespace {
template <typename T>
T row_rstd(const T* x, int64_t D, double eps) {
  double ss = 0;
  for (int64_t j = 0; j < D; ++j) ss += double(x[j]) * double(x[j]);
  return T(1.0 / std::sqrt(ss / double(D) + eps));
}
void check_dims(int64_t N, int64_t D, double eps, const char* who) {
  OLMO_CHECK(N >= 0 && D > 0, who, ": bad shape N=", N, " D=", D);
  OLMO_CHECK(eps >= 0 && std::isfinite(eps), who, ": eps must be finite and >= 0, got ", eps);
}
}  // namespace

template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t N, int64_t D, double eps) {
  rmsnorm_forward_grouped(x, w, 1, y, rstd, N, D, eps);
}

template <typename T>
void rmsnorm_forward_grouped(const T* x, const T* w_all, int64_t G, T* y, T* rstd, int64_t N, int64_t D,
                             double eps) {
  check_dims(N, D, eps, "rmsnorm_forward");
  OLMO_CHECK(G >= 1, "rmsnorm_forward: gain groups must be >= 1, got ", G);
  parallel_for(
      N,
      [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const T* xi = x + i * D;
          T* yi = y + i * D;
          const T r = row_rstd(xi, D, eps);
          if (rstd) rstd[i] = r;
          const T* w = w_all ? w_all + (i % G) * D : nullptr;
          if (w)
            for (int64_t j = 0; j < D; ++j) yi[j] = w[j] * (xi[j] * r);
          else
            for (int64_t j = 0; j < D; ++j) yi[j] = xi[j] * r;
        }
      },
      8);
}

template <typename T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t N, int64_t D,
                      double eps) {
  rmsnorm_backward_grouped(dy, x, w, 1, rstd, dx, dw, N, D, eps);
}

template <typename T>
void rmsnorm_backward_grouped(const T* dy, const T* x, const T* w_all, int64_t G, const T* rstd, T* dx, T* dw,
                              int64_t N, int64_t D, double eps) {
  check_dims(N, D, eps, "rmsnorm_backward");
  OLMO_CHECK(G >= 1, "rmsnorm_backward: gain groups must be >= 1, got ", G);
  const bool want_dw = w_all != nullptr && dw != nullptr;
  // Fixed blocking of rows for the dw partial sums (independent of the thread count).
  const int64_t P = std::max<int64_t>(1, std::min<int64_t>(16, N)), GD = G * D;
  std::vector<double> part(want_dw ? size_t(P * GD) : 0, 0.0);
  parallel_for(P, [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      for (int64_t i = N * p / P; i < N * (p + 1) / P; ++i) {
        const T* w = w_all ? w_all + (i % G) * D : nullptr;
        double* dwp = want_dw ? part.data() + p * GD + (i % G) * D : nullptr;
        const T* xi = x + i * D;
        const T* dyi = dy + i * D;
        T* dxi = dx + i * D;
        const double r = rstd ? double(rstd[i]) : double(row_rstd(xi, D, eps));
        double dot = 0;  // sum_j x_j g_j
        if (w)
          for (int64_t j = 0; j < D; ++j) dot += double(xi[j]) * (double(w[j]) * double(dyi[j]));
        else
          for (int64_t j = 0; j < D; ++j) dot += double(xi[j]) * double(dyi[j]);
        const T c = T(r * r * r * dot / double(D)), rr = T(r);
        if (w)
          for (int64_t j = 0; j < D; ++j) dxi[j] = rr * (w[j] * dyi[j]) - xi[j] * c;
        else
          for (int64_t j = 0; j < D; ++j) dxi[j] = rr * dyi[j] - xi[j] * c;
        if (dwp)
          for (int64_t j = 0; j < D; ++j) dwp[j] += double(dyi[j]) * double(xi[j]) * r;
      }
    }
  });
  if (want_dw)
    for (int64_t j = 0; j < GD; ++j) {
      double s = 0;
      for (int64_t p = 0; p < P; ++p) s += part[p * GD + j];
      dw[j] += T(s);
    }
}

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t, double);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, int64_t, int64_t,
                                      double);
template void rmsnorm_backward<float>(const float*, const float*, const float*, const float*, float*, float*,
                                      int64_t, int64_t, double);
template void rmsnorm_backward<double>(const double*, const double*, const double*, const double*, double*,
                                       double*, int64_t, int64_t, double);
template void rmsnorm_forward_grouped<float>(const float*, const float*, int64_t, float*, float*, int64_t,
                                             int64_t, double);
template void rmsnorm_forward_grouped<double>(const double*, const double*, int64_t, double*, double*,
                                              int64_t, int64_t, double);
template void rmsnorm_backward_grouped<float>(const float*, const float*, const float*, int64_t, const float*,
                                              float*, float*, int64_t, int64_t, double);
template void rmsnorm_backward_grouped<double>(const double*, const double*, const double*, int64_t,
                                               const double*, double*, double*, int64_t, int64_t, double);

namespace {
void check_t(const Tensor& t, const Shape& shape, DType dt, const char* who, const char* name) {
  OLMO_CHECK(t.dtype() == dt && t.is_contiguous(), who, ": ", name, " must be contiguous ", dtype_name(dt),
             ", got ", dtype_name(t.dtype()));
  OLMO_CHECK(t.shape() == shape, who, ": ", name, " has shape ", shape_str(t.shape()), ", expected ",
             shape_str(shape));
}
template <typename T>
T* opt(const Tensor& t) {
  return t.defined() ? const_cast<T*>(t.data<T>()) : nullptr;
}
}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, double eps) {
  OLMO_CHECK(x.defined() && x.ndim() >= 1, "rmsnorm_forward: x must have >= 1 dim");
  const DType dt = x.dtype();
  OLMO_CHECK(dt == DType::F32 || dt == DType::F64, "rmsnorm_forward: x must be F32/F64, got ",
             dtype_name(dt));
  const int64_t D = x.size(-1), N = x.numel() / std::max<int64_t>(1, D);
  check_t(x, x.shape(), dt, "rmsnorm_forward", "x");
  check_t(y, x.shape(), dt, "rmsnorm_forward", "y");
  if (w.defined()) check_t(w, {D}, dt, "rmsnorm_forward", "w");
  if (rstd.defined()) check_t(rstd, {N}, dt, "rmsnorm_forward", "rstd");
  if (dt == DType::F32)
    rmsnorm_forward<float>(x.data<float>(), opt<float>(w), y.data<float>(), opt<float>(rstd), N, D, eps);
  else
    rmsnorm_forward<double>(x.data<double>(), opt<double>(w), y.data<double>(), opt<double>(rstd), N, D, eps);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                      Tensor& dw, double eps) {
  OLMO_CHECK(x.defined() && x.ndim() >= 1, "rmsnorm_backward: x must have >= 1 dim");
  const DType dt = x.dtype();
  OLMO_CHECK(dt == DType::F32 || dt == DType::F64, "rmsnorm_backward: x must be F32/F64, got ",
             dtype_name(dt));
  const int64_t D = x.size(-1), N = x.numel() / std::max<int64_t>(1, D);
  check_t(x, x.shape(), dt, "rmsnorm_backward", "x");
  check_t(dy, x.shape(), dt, "rmsnorm_backward", "dy");
  check_t(dx, x.shape(), dt, "rmsnorm_backward", "dx");
  if (w.defined()) check_t(w, {D}, dt, "rmsnorm_backward", "w");
  if (dw.defined()) check_t(dw, {D}, dt, "rmsnorm_backward", "dw");
  if (rstd.defined()) check_t(rstd, {N}, dt, "rmsnorm_backward", "rstd");
  if (dt == DType::F32)
    rmsnorm_backward<float>(dy.data<float>(), x.data<float>(), opt<float>(w), opt<float>(rstd),
                            dx.data<float>(), opt<float>(dw), N, D, eps);
  else
    rmsnorm_backward<double>(dy.data<double>(), x.data<double>(), opt<double>(w), opt<double>(rstd),
                             dx.data<double>(), opt<double>(dw), N, D, eps);
}

}  // namespace olmosft
