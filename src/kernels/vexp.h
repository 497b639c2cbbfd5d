// Vectorised float exp and the row reductions built on it (softmax cross-entropy, attention's softmax).
//
// Forward math (one lane; every path computes exactly these operations, so a lane's result is the same
// bits on every path and at every position of an array):
//   x  <- clamp(x, -104, 89)            (NaN passes through; exp(-104) and exp(-inf) round to 0, exp(89)
//                                          overflows to +inf, as exp does)
//   z  = fma(x, log2(e), 1.5 * 2^23),  n = z - 1.5 * 2^23        (n = x / ln 2 rounded to nearest, exact)
//   r  = fma(-n, ln2_hi, x),  r = fma(-n, ln2_lo, r)              (Cody-Waite; ln2_hi = float(ln 2),
//                                                                    |r| <= ln(2) / 2)
//   p  = 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4)       (Horner in fma, minimax for the relative
//                                                                    error of e^r on |r| <= ln(2)/2: 3.8e-9
//                                                                    with the float coefficients)
//   exp(x) = (p * 2^(n >> 1)) * 2^(n - (n >> 1))                  (n in [-150, 128]: both factors are
//                                                                    normal; the first product is exact,
//                                                                    so the scaling rounds only once, also
//                                                                    into the subnormal range)
// Accuracy against exp in double, in units of the float result's last place (ulp 2^-149 below 2^-126):
// normal results at most 0.85 ulp (worst where |r| -> ln(2)/2), subnormal results at most 0.86 ulp, -inf
// and x < -103.97 give +0 (kernels_vexp_test: every 251st of the 2^32 bit patterns plus every float of
// [-104, -87.3] and [88, 89], 41.4M inputs; `OLMOSFT_VEXP_EXHAUSTIVE=1` sweeps all 2^32).
//
// Reductions use 16 lanes: element i goes to lane i % 16 (a tail's missing lanes add 0 / take -inf), and
// the lanes are summed by the fixed tree (l, l + 8) -> (l, l + 4) -> (l, l + 2) -> (0, 1). The AVX-512
// path holds the 16 lanes in one register, the AVX2 path in two, the scalar path in an array: all three
// give the same bits. A row's result depends only on the row, never on how rows are split over threads.
//
// Paths: AVX-512F, AVX2+FMA (compiled with target attributes, chosen at run time from CPUID), a scalar
// path, and `libm`: glibc's expf element by element with sequential sums (the pre-vexp arithmetic of the
// cross-entropy, kept as the reference for benchmarks and drift measurements; never chosen by itself).
// OLMOSFT_VEXP=libm|scalar|avx2|avx512 in the environment picks a path at the first call.
#pragma once
#include <cstdint>

namespace olmosft {

enum class VexpPath : int { kLibm = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };

const char* vexp_path_name(VexpPath p);
bool vexp_path_supported(VexpPath p);  // this CPU can run it
VexpPath vexp_path();                  // the path in use (the best supported unless set)
// Test and benchmark hook: use path p from now on (it must be supported); returns the previous path.
VexpPath vexp_set_path(VexpPath p);

// exp(x) of one value: the lane formula above (the same bits as any vector path; libm: std::exp).
float vexp1(float x);
// y[i] = exp(x[i]) for i < n (y may equal x).
void vexp(const float* x, float* y, int64_t n);
// x[i] = exp(x[i] - sub); returns their sum in float (16-lane tree).
float vexp_sub_sum(float* x, int64_t n, float sub);
// Returns sum_i double(exp(x[i] - sub)), accumulated in double (16-lane tree); x is not written.
double vexp_sub_sum_f64(const float* x, int64_t n, float sub);
// x[i] = exp(x[i] - sub) * k.
void vexp_sub_scale(float* x, int64_t n, float sub, float k);
// max_i x[i] (n >= 1), with the vector max's rule max(a, b) = a > b ? a : b over the 16-lane tree.
float vmax(const float* x, int64_t n);

}  // namespace olmosft
