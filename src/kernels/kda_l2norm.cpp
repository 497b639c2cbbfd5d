// Row-wise L2 normalisation (fla l2norm, eps inside the sqrt) used on KDA q and k per head.
#include <cmath>

#include "core/threads.h"
#include "kernels/kda.h"

namespace olmosft::kda {

template <typename T>
void l2norm_forward(const T* x, int64_t N, int64_t D, T eps, T* y) {
  parallel_for(
      N,
      [&](int64_t lo, int64_t hi) {
        for (int64_t n = lo; n < hi; ++n) {
          const T* xr = x + n * D;
          T ss = 0;
          for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
          const T r = T(1) / std::sqrt(ss + eps);
          for (int64_t i = 0; i < D; ++i) y[n * D + i] = xr[i] * r;
        }
      },
      256);
}

// y = x r, r = (|x|^2 + eps)^-1/2:  dx = r (dy - y (y . dy)).
template <typename T>
void l2norm_backward(const T* x, const T* dy, int64_t N, int64_t D, T eps, T* dx) {
  parallel_for(
      N,
      [&](int64_t lo, int64_t hi) {
        for (int64_t n = lo; n < hi; ++n) {
          const T* xr = x + n * D;
          const T* dyr = dy + n * D;
          T ss = 0, xdy = 0;
          for (int64_t i = 0; i < D; ++i) {
            ss += xr[i] * xr[i];
            xdy += xr[i] * dyr[i];
          }
          const T r = T(1) / std::sqrt(ss + eps);
          const T ydy = xdy * r;
          for (int64_t i = 0; i < D; ++i) dx[n * D + i] = r * (dyr[i] - xr[i] * r * ydy);
        }
      },
      256);
}

template void l2norm_forward<float>(const float*, int64_t, int64_t, float, float*);
template void l2norm_forward<double>(const double*, int64_t, int64_t, double, double*);
template void l2norm_backward<float>(const float*, const float*, int64_t, int64_t, float, float*);
template void l2norm_backward<double>(const double*, const double*, int64_t, int64_t, double, double*);

}  // namespace olmosft::kda
