// Vectorised float exp; see vexp.h for the math, the lane layout and the accuracy. Compiled with
// -ffp-contract=off (cmake/kernels.cmake): a multiply followed by an add must stay two roundings on every
// path, or the paths would differ in bits.
#include "kernels/vexp.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define OLMOSFT_VEXP_X86 1
// GCC 12's AVX-512 intrinsics fill unused operands with _mm512_undefined_ps(), a self-initialised variable
// that -Wuninitialized reports once the intrinsic is inlined; the operand is never read (full masks).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace olmosft {

namespace {

constexpr float kLo = -104.0f, kHi = 89.0f;
constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kShift = 0x1.8p23f;  // adding it rounds |v| < 2^22 to an integer, held in the low bits
constexpr float kLn2Hi = 0x1.62e430p-1f;
constexpr float kLn2Lo = -0x1.05c610p-29f;  // ln 2 - kLn2Hi
constexpr float kC2 = 0x1.fffffcp-2f, kC3 = 0x1.555492p-3f, kC4 = 0x1.5558f2p-5f, kC5 = 0x1.1239d6p-7f,
                kC6 = 0x1.6a2448p-10f;
constexpr int32_t kShiftBits = std::bit_cast<int32_t>(kShift);
constexpr int kLanes = 16;

// kStore: y = e; kScale: y = e * k; kStoreSum: y = e and sum in float; kSumF64: sum in double only.
enum class Op { kStore, kScale, kStoreSum, kSumF64 };

// ---- scalar lanes: the vector instructions' semantics, one lane at a time ------------------------------
inline float max_ps(float a, float b) { return a > b ? a : b; }  // MAXPS: the second operand on NaN
inline float min_ps(float a, float b) { return a < b ? a : b; }
inline float pow2(int32_t e) { return std::bit_cast<float>((e + 127) << 23); }

float exp_lane(float x) {
  x = min_ps(kHi, max_ps(kLo, x));
  const float z = std::fma(x, kLog2e, kShift);
  const float n = z - kShift;
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float q = std::fma(kC6, r, kC5);
  q = std::fma(q, r, kC4);
  q = std::fma(q, r, kC3);
  q = std::fma(q, r, kC2);
  q = std::fma(q, r, 1.0f);
  const float p = std::fma(q, r, 1.0f);
  const int32_t ni = std::bit_cast<int32_t>(z) - kShiftBits;
  const int32_t e1 = ni >> 1, e2 = ni - e1;
  return p * pow2(e1) * pow2(e2);
}

template <typename A>
A tree_sum(A* l) {  // (l, l + 8) -> (l, l + 4) -> (l, l + 2) -> (0, 1), in place
  for (int w = 8; w >= 2; w /= 2)
    for (int i = 0; i < w; ++i) l[i] = l[i] + l[i + w];
  return l[0] + l[1];
}

template <Op op>
double run_scalar(const float* x, float* y, int64_t n, float sub, float k) {
  float acc[kLanes] = {};
  double acc64[kLanes] = {};
  for (int64_t i0 = 0; i0 < n; i0 += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const int64_t i = i0 + l;
      const float e = i < n ? exp_lane(x[i] - sub) : 0.0f;
      if constexpr (op == Op::kStore || op == Op::kStoreSum)
        if (i < n) y[i] = e;
      if constexpr (op == Op::kScale)
        if (i < n) y[i] = e * k;
      if constexpr (op == Op::kStoreSum) acc[l] = acc[l] + e;
      if constexpr (op == Op::kSumF64) acc64[l] = acc64[l] + double(e);
    }
  if constexpr (op == Op::kStoreSum) return double(tree_sum(acc));
  if constexpr (op == Op::kSumF64) return tree_sum(acc64);
  return 0;
}

float max_scalar(const float* x, int64_t n) {
  float acc[kLanes];
  std::fill_n(acc, kLanes, -std::numeric_limits<float>::infinity());
  for (int64_t i0 = 0; i0 < n; i0 += kLanes)
    for (int l = 0; l < kLanes; ++l)
      acc[l] = max_ps(acc[l], i0 + l < n ? x[i0 + l] : -std::numeric_limits<float>::infinity());
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) acc[i] = max_ps(acc[i], acc[i + w]);
  return acc[0];
}

// ---- libm: glibc's expf, sequential (the cross-entropy's arithmetic before vexp) -------------------------
template <Op op>
double run_libm(const float* x, float* y, int64_t n, float sub, float k) {
  float s32 = 0;
  double s64 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = std::exp(x[i] - sub);
    if constexpr (op == Op::kStore || op == Op::kStoreSum) y[i] = e;
    if constexpr (op == Op::kScale) y[i] = e * k;
    if constexpr (op == Op::kStoreSum) s32 += e;
    if constexpr (op == Op::kSumF64) s64 += double(e);
  }
  return op == Op::kSumF64 ? s64 : double(s32);
}

float max_libm(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

#if OLMOSFT_VEXP_X86
// ---- AVX2 + FMA: 16 lanes in two registers ---------------------------------------------------------------
#define OLMOSFT_AVX2 __attribute__((target("avx2,fma")))

OLMOSFT_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(kHi), _mm256_max_ps(_mm256_set1_ps(kLo), x));
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(kShift));
  const __m256 n = _mm256_sub_ps(z, _mm256_set1_ps(kShift));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(kC6), r, _mm256_set1_ps(kC5));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kC4));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kC3));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kC2));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
  const __m256 p = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(z), _mm256_set1_epi32(kShiftBits));
  const __m256i e1 = _mm256_srai_epi32(ni, 1), e2 = _mm256_sub_epi32(ni, e1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

OLMOSFT_AVX2 inline __m256i tail_mask8(int64_t left, int first) {  // lanes first.. of a 16-lane block
  const __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(std::min<int64_t>(left, kLanes))), idx);
}

OLMOSFT_AVX2 inline double hsum8(__m256 v) {  // (l, l + 4) -> (l, l + 2) -> (0, 1)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return double(_mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1))));
}

OLMOSFT_AVX2 inline double hsum4d(__m256d v) {  // (l, l + 2) -> (0, 1)
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

template <Op op>
OLMOSFT_AVX2 double run_avx2(const float* x, float* y, int64_t n, float sub, float k) {
  const __m256 vs = _mm256_set1_ps(sub), vk = _mm256_set1_ps(k);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256d d0 = _mm256_setzero_pd(), d1 = _mm256_setzero_pd(), d2 = _mm256_setzero_pd(),
          d3 = _mm256_setzero_pd();
  for (int64_t i = 0; i < n; i += kLanes) {
    const bool full = n - i >= kLanes;
    const __m256i m0 = tail_mask8(n - i, 0), m1 = tail_mask8(n - i, 8);
    const __m256 v0 = full ? _mm256_loadu_ps(x + i) : _mm256_maskload_ps(x + i, m0);
    const __m256 v1 = full ? _mm256_loadu_ps(x + i + 8) : _mm256_maskload_ps(x + i + 8, m1);
    __m256 e0 = exp8(_mm256_sub_ps(v0, vs)), e1 = exp8(_mm256_sub_ps(v1, vs));
    if (!full) {
      e0 = _mm256_and_ps(e0, _mm256_castsi256_ps(m0));
      e1 = _mm256_and_ps(e1, _mm256_castsi256_ps(m1));
    }
    if constexpr (op == Op::kScale) {
      e0 = _mm256_mul_ps(e0, vk);
      e1 = _mm256_mul_ps(e1, vk);
    }
    if constexpr (op != Op::kSumF64) {
      if (full) {
        _mm256_storeu_ps(y + i, e0);
        _mm256_storeu_ps(y + i + 8, e1);
      } else {
        _mm256_maskstore_ps(y + i, m0, e0);
        _mm256_maskstore_ps(y + i + 8, m1, e1);
      }
    }
    if constexpr (op == Op::kStoreSum) {
      a0 = _mm256_add_ps(a0, e0);
      a1 = _mm256_add_ps(a1, e1);
    }
    if constexpr (op == Op::kSumF64) {
      d0 = _mm256_add_pd(d0, _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
      d1 = _mm256_add_pd(d1, _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
      d2 = _mm256_add_pd(d2, _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
      d3 = _mm256_add_pd(d3, _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
    }
  }
  if constexpr (op == Op::kStoreSum) return hsum8(_mm256_add_ps(a0, a1));
  // lanes 0-3 = d0, 4-7 = d1, 8-11 = d2, 12-15 = d3: (l, l + 8) then (l, l + 4)
  if constexpr (op == Op::kSumF64) return hsum4d(_mm256_add_pd(_mm256_add_pd(d0, d2), _mm256_add_pd(d1, d3)));
  return 0;
}

OLMOSFT_AVX2 float max_avx2(const float* x, int64_t n) {
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 a0 = ninf, a1 = ninf;
  for (int64_t i = 0; i < n; i += kLanes) {
    __m256 v0, v1;
    if (n - i >= kLanes) {
      v0 = _mm256_loadu_ps(x + i);
      v1 = _mm256_loadu_ps(x + i + 8);
    } else {
      const __m256i m0 = tail_mask8(n - i, 0), m1 = tail_mask8(n - i, 8);
      v0 = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, m0), _mm256_castsi256_ps(m0));
      v1 = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i + 8, m1), _mm256_castsi256_ps(m1));
    }
    a0 = _mm256_max_ps(a0, v0);
    a1 = _mm256_max_ps(a1, v1);
  }
  __m256 m8 = _mm256_max_ps(a0, a1);
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// ---- AVX-512F: 16 lanes in one register -------------------------------------------------------------------
#define OLMOSFT_AVX512 __attribute__((target("avx512f")))

OLMOSFT_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(kHi), _mm512_max_ps(_mm512_set1_ps(kLo), x));
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(kShift));
  const __m512 n = _mm512_sub_ps(z, _mm512_set1_ps(kShift));
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(kC6), r, _mm512_set1_ps(kC5));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kC4));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kC3));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(kC2));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  const __m512 p = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
  const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(z), _mm512_set1_epi32(kShiftBits));
  const __m512i e1 = _mm512_srai_epi32(ni, 1), e2 = _mm512_sub_epi32(ni, e1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e2, bias), 23));
  return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

OLMOSFT_AVX512 inline __mmask16 tail_mask16(int64_t left) {
  return left >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

OLMOSFT_AVX512 inline __m256 hi256(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

template <Op op>
OLMOSFT_AVX512 double run_avx512(const float* x, float* y, int64_t n, float sub, float k) {
  const __m512 vs = _mm512_set1_ps(sub), vk = _mm512_set1_ps(k);
  __m512 acc = _mm512_setzero_ps();
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = tail_mask16(n - i);
    __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vs)));
    if constexpr (op == Op::kScale) e = _mm512_mul_ps(e, vk);
    if constexpr (op != Op::kSumF64) _mm512_mask_storeu_ps(y + i, m, e);
    if constexpr (op == Op::kStoreSum) acc = _mm512_add_ps(acc, e);
    if constexpr (op == Op::kSumF64) {
      lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
      hi = _mm512_add_pd(hi, _mm512_cvtps_pd(hi256(e)));
    }
  }
  if constexpr (op == Op::kStoreSum) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), hi256(acc));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return double(_mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1))));
  }
  if constexpr (op == Op::kSumF64) {
    const __m512d s8 = _mm512_add_pd(lo, hi);
    const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s8), _mm512_extractf64x4_pd(s8, 1));
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  }
  return 0;
}

OLMOSFT_AVX512 float max_avx512(const float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 acc = ninf;
  for (int64_t i = 0; i < n; i += kLanes)
    acc = _mm512_max_ps(acc, _mm512_mask_loadu_ps(ninf, tail_mask16(n - i), x + i));
  const __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(acc), hi256(acc));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}
#endif  // OLMOSFT_VEXP_X86

// ---- dispatch
// ----------------------------------------------------------------------------------------------
std::atomic<int> g_path{-1};

VexpPath best_path() {
#if OLMOSFT_VEXP_X86
  if (__builtin_cpu_supports("avx512f")) return VexpPath::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VexpPath::kAvx2;
#endif
  return VexpPath::kScalar;
}

VexpPath initial_path() {
  const char* env = std::getenv("OLMOSFT_VEXP");
  if (env == nullptr || *env == '\0') return best_path();
  for (VexpPath p : {VexpPath::kLibm, VexpPath::kScalar, VexpPath::kAvx2, VexpPath::kAvx512})
    if (std::strcmp(env, vexp_path_name(p)) == 0) {
      OLMO_CHECK(vexp_path_supported(p), "OLMOSFT_VEXP=", env, ": this CPU cannot run that path");
      return p;
    }
  fail("OLMOSFT_VEXP=", env, ": expected libm, scalar, avx2 or avx512");
}

template <Op op>
double run(const float* x, float* y, int64_t n, float sub, float k) {
  OLMO_CHECK(n >= 0, "vexp: negative length ", n);
  switch (vexp_path()) {
    case VexpPath::kLibm:
      return run_libm<op>(x, y, n, sub, k);
#if OLMOSFT_VEXP_X86
    case VexpPath::kAvx2:
      return run_avx2<op>(x, y, n, sub, k);
    case VexpPath::kAvx512:
      return run_avx512<op>(x, y, n, sub, k);
#endif
    default:
      return run_scalar<op>(x, y, n, sub, k);
  }
}

}  // namespace

const char* vexp_path_name(VexpPath p) {
  switch (p) {
    case VexpPath::kLibm:
      return "libm";
    case VexpPath::kScalar:
      return "scalar";
    case VexpPath::kAvx2:
      return "avx2";
    case VexpPath::kAvx512:
      return "avx512";
  }
  return "?";
}

bool vexp_path_supported(VexpPath p) {
  if (p == VexpPath::kLibm || p == VexpPath::kScalar) return true;
#if OLMOSFT_VEXP_X86
  if (p == VexpPath::kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (p == VexpPath::kAvx512) return __builtin_cpu_supports("avx512f");
#endif
  return false;
}

VexpPath vexp_path() {
  int p = g_path.load(std::memory_order_relaxed);
  if (p < 0) {
    int expected = -1;
    g_path.compare_exchange_strong(expected, int(initial_path()));
    p = g_path.load(std::memory_order_relaxed);
  }
  return VexpPath(p);
}

VexpPath vexp_set_path(VexpPath p) {
  OLMO_CHECK(vexp_path_supported(p), "vexp_set_path: this CPU cannot run the ", vexp_path_name(p), " path");
  const VexpPath old = vexp_path();
  g_path.store(int(p), std::memory_order_relaxed);
  return old;
}

float vexp1(float x) { return vexp_path() == VexpPath::kLibm ? std::exp(x) : exp_lane(x); }

void vexp(const float* x, float* y, int64_t n) { run<Op::kStore>(x, y, n, 0.0f, 1.0f); }

float vexp_sub_sum(float* x, int64_t n, float sub) { return float(run<Op::kStoreSum>(x, x, n, sub, 1.0f)); }

double vexp_sub_sum_f64(const float* x, int64_t n, float sub) {
  return run<Op::kSumF64>(x, nullptr, n, sub, 1.0f);
}

void vexp_sub_scale(float* x, int64_t n, float sub, float k) { run<Op::kScale>(x, x, n, sub, k); }

float vmax(const float* x, int64_t n) {
  OLMO_CHECK(n >= 1, "vmax: needs at least one element, got ", n);
  switch (vexp_path()) {
    case VexpPath::kLibm:
      return max_libm(x, n);
#if OLMOSFT_VEXP_X86
    case VexpPath::kAvx2:
      return max_avx2(x, n);
    case VexpPath::kAvx512:
      return max_avx512(x, n);
#endif
    default:
      return max_scalar(x, n);
  }
}

}  // namespace olmosft
