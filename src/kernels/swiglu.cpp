#include "kernels/swiglu.h"

#include <algorithm>
#include <cmath>

#include "core/threads.h"
#include "kernels/vexp.h"

namespace olmosft {

namespace {
// e[i] = exp(-x[i]): float through vexp (kernels/vexp.h: vectorised, the same bits on its every path and at
// any position), double (the finite-difference checks) through std::exp.
void neg_exp(const float* x, float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = -x[i];
  vexp(e, e, n);
}
void neg_exp(const double* x, double* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = std::exp(-x[i]);
}
constexpr int64_t kSeg = 256;  // elements of a row handled per exp call

void check_ld(int64_t N, int64_t F, std::initializer_list<int64_t> lds, const char* who) {
  OLMO_CHECK(N >= 0 && F >= 0, who, ": bad shape N=", N, " F=", F);
  for (int64_t ld : lds) OLMO_CHECK(N <= 1 || ld >= F, who, ": leading dimension ", ld, " < row length ", F);
}
}  // namespace

template <typename T>
void swiglu_forward(const T* a, int64_t lda, const T* b, int64_t ldb, T* h, int64_t ldh, int64_t N,
                    int64_t F) {
  check_ld(N, F, {lda, ldb, ldh}, "swiglu_forward");
  // Split the flattened N*F index space so a single long row is parallel too.
  parallel_for(
      N * F,
      [&](int64_t s, int64_t e) {
        for (int64_t idx = s; idx < e;) {
          const int64_t i = idx / F, j0 = idx % F, j1 = std::min<int64_t>(F, j0 + (e - idx));
          const T* ai = a + i * lda;
          const T* bi = b + i * ldb;
          T* hi = h + i * ldh;
          T e[kSeg];
          for (int64_t c = j0; c < j1; c += kSeg) {
            const int64_t m = std::min(kSeg, j1 - c);
            neg_exp(ai + c, e, m);
            for (int64_t j = 0; j < m; ++j) hi[c + j] = ai[c + j] / (T(1) + e[j]) * bi[c + j];
          }
          idx += j1 - j0;
        }
      },
      4096);
}

template <typename T>
void swiglu_backward(const T* dh, int64_t lddh, const T* a, int64_t lda, const T* b, int64_t ldb, T* da,
                     int64_t ldda, T* db, int64_t lddb, int64_t N, int64_t F) {
  check_ld(N, F, {lddh, lda, ldb, ldda, lddb}, "swiglu_backward");
  parallel_for(
      N * F,
      [&](int64_t s, int64_t e) {
        for (int64_t idx = s; idx < e;) {
          const int64_t i = idx / F, j0 = idx % F, j1 = std::min<int64_t>(F, j0 + (e - idx));
          T e[kSeg];
          for (int64_t c = j0; c < j1; c += kSeg) {
            const int64_t m = std::min(kSeg, j1 - c);
            neg_exp(a + i * lda + c, e, m);
            for (int64_t jj = 0; jj < m; ++jj) {
              const int64_t j = c + jj;
              const T x = a[i * lda + j], g = dh[i * lddh + j];
              const T sg = T(1) / (T(1) + e[jj]);
              if (db) db[i * lddb + j] = g * (x * sg);
              if (da) da[i * ldda + j] = g * b[i * ldb + j] * (sg * (T(1) + x * (T(1) - sg)));
            }
          }
          idx += j1 - j0;
        }
      },
      4096);
}

template void swiglu_forward<float>(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t,
                                    int64_t);
template void swiglu_forward<double>(const double*, int64_t, const double*, int64_t, double*, int64_t,
                                     int64_t, int64_t);
template void swiglu_backward<float>(const float*, int64_t, const float*, int64_t, const float*, int64_t,
                                     float*, int64_t, float*, int64_t, int64_t, int64_t);
template void swiglu_backward<double>(const double*, int64_t, const double*, int64_t, const double*, int64_t,
                                      double*, int64_t, double*, int64_t, int64_t, int64_t);

namespace {
void check_same(const Tensor& ref, const Tensor& t, const char* who, const char* name) {
  OLMO_CHECK(t.defined(), who, ": ", name, " is undefined");
  OLMO_CHECK(t.dtype() == ref.dtype() && t.is_contiguous(), who, ": ", name, " must be contiguous ",
             dtype_name(ref.dtype()));
  OLMO_CHECK(t.shape() == ref.shape(), who, ": ", name, " has shape ", shape_str(t.shape()), ", expected ",
             shape_str(ref.shape()));
}
}  // namespace

void swiglu_forward(const Tensor& a, const Tensor& b, Tensor& h) {
  OLMO_CHECK(a.defined() && (a.dtype() == DType::F32 || a.dtype() == DType::F64),
             "swiglu_forward: a must be F32/F64");
  check_same(a, a, "swiglu_forward", "a");
  check_same(a, b, "swiglu_forward", "b");
  check_same(a, h, "swiglu_forward", "h");
  if (a.dtype() == DType::F32)
    swiglu_forward<float>(a.data<float>(), b.data<float>(), h.data<float>(), a.numel());
  else
    swiglu_forward<double>(a.data<double>(), b.data<double>(), h.data<double>(), a.numel());
}

void swiglu_backward(const Tensor& dh, const Tensor& a, const Tensor& b, Tensor& da, Tensor& db) {
  OLMO_CHECK(a.defined() && (a.dtype() == DType::F32 || a.dtype() == DType::F64),
             "swiglu_backward: a must be F32/F64");
  for (auto [t, n] : {std::pair{&a, "a"}, {&b, "b"}, {&dh, "dh"}, {&da, "da"}, {&db, "db"}})
    check_same(a, *t, "swiglu_backward", n);
  if (a.dtype() == DType::F32)
    swiglu_backward<float>(dh.data<float>(), a.data<float>(), b.data<float>(), da.data<float>(),
                           db.data<float>(), a.numel());
  else
    swiglu_backward<double>(dh.data<double>(), a.data<double>(), b.data<double>(), da.data<double>(),
                            db.data<double>(), a.numel());
}

}  // namespace olmosft
