// Chunked (WY / UT-transform) KDA, forward and backward (docs/reference/architecture.md C.3;
// docs/reference/anchors.md section 3).
//
// Per (row, head), the tokens of each document are cut into chunks of at most `chunk` tokens starting at the
// document's first token (fla's cu_seqlens layout), so a chunk never spans a document boundary and no
// masking across documents is needed; the state restarts at zero at each document start. Within a chunk
// (positions i, j = 0..n-1, Gam = in-chunk cumulative log-decay):
//   P[i,j]   = sum_c k_i[c] k_j[c] exp(Gam_i[c] - Gam_j[c])   (j < i),   Akk = Diag(beta) P,  M = I + Akk
//   Aqk[i,j] = sum_c q~_i[c] k_j[c] exp(Gam_i[c] - Gam_j[c])  (j <= i)
//   W = M^-1 Diag(beta) (K . e^Gam),  U = M^-1 Diag(beta) V,  Vn = U - W S
//   O = (Q~ . e^Gam) S + Aqk Vn,      S <- Diag(e^Gam_last) S + (K . e^(Gam_last - Gam))^T Vn
// The pairwise exponentials are evaluated directly (every exponent is <= 0, so nothing overflows whatever
// the decay). The cumulative decay Gam is accumulated in double even for float inputs: after one very strong
// step (g ~ -1e3) a float cumsum has lost the small later steps (ulp(1e3) ~ 6e-5), so Gam_i - Gam_j of
// nearby tokens would be wrong; in double the difference is exact to float precision. GEMMs go to
// kernels/gemm.h (OpenBLAS or oneDNN); the unit-lower-triangular solves are substitution loops here.
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"

namespace olmosft::kda {

namespace {

// Solves op(M) X = B in place (B: [n, N]) with M = I + strict_lower(A) (A's diagonal is not read), by
// substitution: row i -= sum_j A[i,j] row j in the order j = 0..i-1 (transposed: from the last row,
// j = n-1..i+1), over strips of columns whose accumulators stay in registers (GCC vector types; OpenBLAS's
// strsm was 8.7% of a T = 16,384 run's samples; 64-byte vectors where AVX-512 is on). Zero coefficients
// (decays flushed to 0) are skipped, which changes nothing for finite B.
#if defined(__AVX512F__)
constexpr int64_t kVecBytes = 64;
#else
constexpr int64_t kVecBytes = 32;
#endif
template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(kVecBytes)));
};

template <typename T>
void solve_strip(bool trans, int64_t n, const T* A, int64_t lda, T* B, int64_t ldb) {
  using VT = typename Vec<T>::type;
  constexpr int64_t L = kVecBytes / sizeof(T), NV = 8;
  for (int64_t s = 1; s < n; ++s) {
    const int64_t i = trans ? n - 1 - s : s;
    T* bi = B + i * ldb;
    VT acc[NV];
#pragma GCC unroll 8
    for (int64_t v = 0; v < NV; ++v) std::memcpy(&acc[v], bi + v * L, sizeof(VT));
    for (int64_t j = trans ? n - 1 : 0; trans ? j > i : j < i; j += trans ? -1 : 1) {
      const T a = trans ? A[j * lda + i] : A[i * lda + j];
      if (a == T(0)) continue;
      const T* bj = B + j * ldb;
#pragma GCC unroll 8
      for (int64_t v = 0; v < NV; ++v) {
        VT x;
        std::memcpy(&x, bj + v * L, sizeof(VT));
        acc[v] -= a * x;
      }
    }
#pragma GCC unroll 8
    for (int64_t v = 0; v < NV; ++v) std::memcpy(bi + v * L, &acc[v], sizeof(VT));
  }
}

// The same on a strip narrower than a register strip (w columns).
template <typename T>
void solve_narrow(bool trans, int64_t n, int64_t w, const T* A, int64_t lda, T* B, int64_t ldb) {
  for (int64_t s = 1; s < n; ++s) {
    const int64_t i = trans ? n - 1 - s : s;
    T* bi = B + i * ldb;
    for (int64_t j = trans ? n - 1 : 0; trans ? j > i : j < i; j += trans ? -1 : 1) {
      const T a = trans ? A[j * lda + i] : A[i * lda + j];
      if (a == T(0)) continue;
      const T* bj = B + j * ldb;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) bi[c] -= a * bj[c];
    }
  }
}

template <typename T>
void solve_unit_lower(bool trans, int64_t n, int64_t N, const T* A, int64_t lda, T* B, int64_t ldb) {
  constexpr int64_t W = kVecBytes / sizeof(T) * 8;
  int64_t c0 = 0;
  for (; c0 + W <= N; c0 += W) solve_strip(trans, n, A, lda, B + c0, ldb);
  if (c0 < N) solve_narrow(trans, n, N - c0, A, lda, B + c0, ldb);
}

// exp(x) for x <= 0 (all exponents in this file are non-positive), written so GCC vectorises it
// (std::exp and std::floor do not vectorise without -ffast-math; the selects need -fno-trapping-math,
// set for these files in cmake/kda.cmake): n = round(x / ln2) (by truncating
// x/ln2 - 1/2 toward zero, valid for x <= 0), r = x - n ln2 (Cody-Waite split),
// exp(r) by its Taylor series (degree 7 for float, 13 for double: truncation below half an ulp for
// |r| <= ln2/2), times 2^n built in the exponent bits. Results below the smallest normal number are
// flushed to zero (std::exp would return a denormal < 1.2e-38 / 2.3e-308). Scalar, inlined into the
// vectorised loops below.
inline float exp_nonpos(float x0) {
  const float keep = float(x0 >= -87.0f);
  const float xv = std::max(x0, -87.0f);
  const float k = float(int32_t(xv * 1.44269504088896341f - 0.5f));  // round to nearest for x <= 0
  const float r = (xv - k * 0.693359375f) + k * 2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (int32_t(k) + 127) << 23;
  return keep * p * std::bit_cast<float>(bits);
}

inline double exp_nonpos(double x0) {
  const double keep = double(x0 >= -708.0);
  const double xv = std::max(x0, -708.0);
  const double k = double(int64_t(xv * 1.4426950408889634074 - 0.5));  // round to nearest for x <= 0
  const double r = (xv - k * 6.93145751953125e-1) - k * 1.42860682030941723212e-6;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const int64_t bits = (int64_t(k) + 1023) << 52;
  return keep * p * std::bit_cast<double>(bits);
}

// y[c] = exp(x[c]), the exponent rounded to T first.
template <typename T>
void vexp_nonpos(const double* x, T* y, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] = exp_nonpos(T(x[c]));
}

// y[c] = exp(a[c] - b[c]): the decay factor of an exponent Gam_i - Gam_j (<= 0), the difference taken in
// double and rounded to T.
template <typename T>
void vexp_diff(const double* a, const double* b, T* y, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) y[c] = exp_nonpos(T(a[c] - b[c]));
}

// The chunk GEMMs are small (chunk x K x V) and run inside the per-(row, head) OpenMP loop; a threaded
// OpenBLAS would spawn its own threads inside each OpenMP thread (measured 3x more CPU and 5x more wall time
// at H = 8, 2 threads). Parallelism comes from rows x heads, so BLAS runs single-threaded while a kernel
// runs (BlasSingleThread, core/threads.h).

// Subnormal floats flushed to zero (x86 MXCSR FTZ and DAZ) in this thread while alive, the previous mode
// restored after. Products of strong decays go below the smallest normal number (e^-87 times a key entry),
// and Intel CPUs take microcode assists on subnormal operands and results (the chunk GEMMs ran 4-7x slower,
// bench/RESULTS.md "bench_kda"). What it changes: a value or term below 1.2e-38 (float) or 2.2e-308 (double)
// counts as 0, an absolute change below that bound, as exp_nonpos already flushes its results; every
// tolerance here is relative to tensors of scale >= 1e-30. Elsewhere (no SSE) a no-op.
class FlushSubnormals {
 public:
#if defined(__SSE2__)
  FlushSubnormals() : prev_(_mm_getcsr()) { _mm_setcsr(prev_ | 0x8040u); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushSubnormals() { _mm_setcsr(prev_); }
#else
  FlushSubnormals() = default;
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
#if defined(__SSE2__)
  unsigned prev_;
#endif
};

struct Chunk {
  int64_t t0, n;
  bool reset;  // first chunk of a document: the incoming state is zero
};

// Chunks of row b, in order. Padding tokens belong to no chunk.
std::vector<Chunk> row_chunks(const std::vector<int64_t>& start, int64_t b, int64_t L, int64_t C) {
  std::vector<Chunk> out;
  int64_t t = 0;
  while (t < L) {
    const int64_t s = start[b * L + t];
    if (s < 0) {
      ++t;
      continue;
    }
    int64_t e = t + 1;
    while (e < L && e - t < C && start[b * L + e] == s) ++e;
    out.push_back({t, e - t, t == s});
    t = e;
  }
  return out;
}

// Sub-chunks of kSub tokens (fla's chunk_kda layout): within a chunk, the pairs (i, j) with i and j in the
// same sub-chunk evaluate e^(Gam_i - Gam_j) directly; the pairs with j in an earlier sub-chunk factor it
// through r = the token before i's sub-chunk, e^(Gam_i - Gam_r) e^(Gam_r - Gam_j), both factors <= 1 (Gam is
// non-increasing and j <= r < i), so nothing overflows whatever the decay, and a factor that flushes to zero
// (exp_nonpos) only drops a product that is itself below the smallest normal. Those blocks are GEMMs.
constexpr int64_t kSub = kChunkSub;

// Per-thread workspace for one chunk; matrices are contiguous with leading dims C (LxL), K, V or LX = K + V.
template <typename T>
struct Work {
  int64_t C, K, V, LX;
  std::vector<double> Gm;  // cumulative log-decay, kept in double (see below)
  std::vector<T> Qs, Kc, Vc, eG, eL, Kg, Kl, bt, P, Akk, Aqk, Vn, Y;
  // X [2C, LX]: rows 0..n-1 hold Q~.e^Gam (first K columns), rows n..2n-1 hold [W | U] (one solve, and [Qg;
  // W] S as one GEMM).
  std::vector<T> X;
  // Sub-chunk factors: Af[i] = e^(Gam_i - Gam_r) (r: the token before i's sub-chunk), KQ = [K.Af; Q~.Af] per
  // sub-chunk (rows 2 a0 ..), and per sub-chunk s >= 1 the earlier tokens' Bf[j] = e^(Gam_r - Gam_j) and
  // K.Bf (rows kSub s(s-1)/2 ..); T2: one block's GEMM result.
  std::vector<T> Af, KQ, Bf, Kb, T2, Dr;
  // backward
  std::vector<T> DOV, R, dWU, dA, dM, dKl, dq, dk, dv, dGm, db, Sd, dGlast, D2, XY, Z;
  // backward: e^(Gam_i - Gam_j) of the pairs a0 <= j <= i inside each sub-chunk, at ((i * kSub) + j - a0) K
  // (written by prepare, read again by pairwise_backward instead of recomputing the exponentials)
  std::vector<T> Ep;
  T* Qg() { return X.data(); }
  T* WU(int64_t n) { return X.data() + n * LX; }
  static int64_t sub_row(int64_t a0) { return (a0 / kSub) * (a0 / kSub - 1) / 2 * kSub; }
  Work(int64_t C_, int64_t K_, int64_t V_, bool bwd) : C(C_), K(K_), V(V_), LX(K_ + V_) {
    auto z = [](std::vector<T>& x, int64_t n) { x.assign(static_cast<size_t>(n), T(0)); };
    const int64_t ns = (C + kSub - 1) / kSub, nb = std::max<int64_t>(1, ns * (ns - 1) / 2 * kSub);
    Gm.assign(static_cast<size_t>(C * K), 0.0);
    for (auto* x : {&Qs, &Kc, &eG, &eL, &Kg, &Kl, &Af}) z(*x, C * K);
    for (auto* x : {&Vc, &Vn}) z(*x, C * V);
    for (auto* x : {&P, &Akk, &Aqk}) z(*x, C * C);
    z(Y, 2 * C * V);
    z(X, 2 * C * LX);
    z(KQ, 2 * C * K);
    z(Bf, nb * K);
    z(Kb, nb * K);
    z(T2, 2 * kSub * C);
    z(Dr, K);
    z(bt, C);
    if (bwd) {
      for (auto* x : {&dKl, &dq, &dk, &dGm, &Z}) z(*x, C * K);
      z(DOV, 2 * C * V);
      z(R, 2 * C * K);
      z(dWU, C * LX);
      z(dv, C * V);
      for (auto* x : {&dA, &dM}) z(*x, C * C);
      z(D2, 2 * kSub * C);
      z(XY, 2 * kSub * K);
      z(db, C);
      z(Sd, K * V);
      z(dGlast, K);
      z(Ep, C * kSub * K);
    }
  }
};

// What prepare computes: everything (the forward and the backward's second pass), or only what carries the
// state across the chunk (the backward's first pass: no Q terms, no Aqk).
enum class Prep { State, Full };

// One pair j <= i of a sub-chunk: p = sum_c k_i[c] k_j[c] e[c] and (kQ) a = sum_c q~_i[c] k_j[c] e[c] with
// e[c] = exp(Gam_i[c] - Gam_j[c]), kept in ep[] when kKeep. One loop: the exponentials never go to memory
// unless kept.
template <bool kQ, bool kKeep, typename T>
void pair_sums(const double* Gi, const double* Gj, const T* ki, const T* kj, const T* qi, int64_t K, T* ep,
               T& p, T& a) {
  T ps = 0, as = 0;
#pragma omp simd reduction(+ : ps, as)
  for (int64_t c = 0; c < K; ++c) {
    const T e = exp_nonpos(T(Gi[c] - Gj[c]));
    if constexpr (kKeep) ep[c] = e;
    const T kje = kj[c] * e;
    ps += ki[c] * kje;
    if constexpr (kQ) as += qi[c] * kje;
  }
  p = ps;
  a = as;
}

// The pairs of sub-chunk [a0, a1) with themselves (j <= i, or j < i without the Q terms), directly.
template <typename T>
void diagonal_block(Work<T>& w, int64_t a0, int64_t a1, bool full, bool keep) {
  const int64_t K = w.K, C = w.C;
  for (int64_t i = a0; i < a1; ++i) {
    const double* Gi = w.Gm.data() + i * K;
    const T* ki = w.Kc.data() + i * K;
    const T* qi = w.Qs.data() + i * K;
    for (int64_t j = a0; j <= (full ? i : i - 1); ++j) {
      const double* Gj = w.Gm.data() + j * K;
      const T* kj = w.Kc.data() + j * K;
      T p = 0, a = 0;
      if (keep)
        pair_sums<true, true>(Gi, Gj, ki, kj, qi, K, w.Ep.data() + (i * kSub + j - a0) * K, p, a);
      else if (full)
        pair_sums<true, false>(Gi, Gj, ki, kj, qi, K, static_cast<T*>(nullptr), p, a);
      else
        pair_sums<false, false>(Gi, Gj, ki, kj, qi, K, static_cast<T*>(nullptr), p, a);
      if (full) w.Aqk[i * C + j] = a;
      w.P[i * C + j] = j < i ? p : T(0);
      w.Akk[i * C + j] = j < i ? w.bt[i] * p : T(0);
    }
  }
}

// The factors of sub-chunk [a0, a1), a0 > 0, r = a0 - 1: Af, K.Af (and Q~.Af) of its rows, Bf and K.Bf of the
// tokens j < a0.
template <typename T>
void sub_factors(Work<T>& w, int64_t a0, int64_t a1, bool full) {
  const int64_t K = w.K, m = a1 - a0;
  const double* Gr = w.Gm.data() + (a0 - 1) * K;
  T* Ka = w.KQ.data() + 2 * a0 * K;
  T* Qa = Ka + m * K;
  for (int64_t i = a0; i < a1; ++i) {
    T* af = w.Af.data() + i * K;
    vexp_diff(w.Gm.data() + i * K, Gr, af, K);
    for (int64_t c = 0; c < K; ++c) {
      Ka[(i - a0) * K + c] = w.Kc[i * K + c] * af[c];
      if (full) Qa[(i - a0) * K + c] = w.Qs[i * K + c] * af[c];
    }
  }
  // Bf of the tokens before the previous sub-chunk: that sub-chunk's Bf times e^(Gam_r - Gam_r'), r' = its
  // reference (a product of factors <= 1, one rounding more per sub-chunk); of the previous sub-chunk's
  // tokens: directly.
  T* bf = w.Bf.data() + Work<T>::sub_row(a0) * K;
  T* kb = w.Kb.data() + Work<T>::sub_row(a0) * K;
  const int64_t p0 = a0 - kSub;
  if (p0 > 0) {
    const T* prev = w.Bf.data() + Work<T>::sub_row(p0) * K;
    vexp_diff(Gr, w.Gm.data() + (p0 - 1) * K, w.Dr.data(), K);
    for (int64_t j = 0; j < p0; ++j)
      for (int64_t c = 0; c < K; ++c) bf[j * K + c] = prev[j * K + c] * w.Dr[c];
  }
  for (int64_t j = std::max<int64_t>(p0, 0); j < a0; ++j) vexp_diff(Gr, w.Gm.data() + j * K, bf + j * K, K);
  for (int64_t j = 0; j < a0; ++j)
    for (int64_t c = 0; c < K; ++c) kb[j * K + c] = w.Kc[j * K + c] * bf[j * K + c];
}

// P, Akk (and with Prep::Full Aqk) of a chunk of n tokens from Gam, K and Q~. When w.Ep is allocated (the
// backward) the exponentials of the diagonal blocks are kept there for pairwise_backward. Off-diagonal
// blocks: [P; Aqk](rows a0..a1, columns 0..a0) = [K.Af; Q~.Af] (K.Bf)^T.
template <typename T>
void pairwise_forward(Work<T>& w, int64_t n, Prep mode) {
  const int64_t K = w.K, C = w.C;
  const bool full = mode == Prep::Full, keep = !w.Ep.empty() && full;
  for (int64_t i = 0; i < n; ++i)
    for (T* m : {w.P.data(), w.Akk.data(), w.Aqk.data()}) std::fill(m + i * C, m + i * C + n, T(0));
  for (int64_t a0 = 0; a0 < n; a0 += kSub) {
    const int64_t a1 = std::min(a0 + kSub, n), m = a1 - a0;
    diagonal_block(w, a0, a1, full, keep);
    if (a0 == 0) continue;
    sub_factors(w, a0, a1, full);
    gemm<T>(Trans::N, Trans::T, full ? 2 * m : m, a0, K, T(1), w.KQ.data() + 2 * a0 * K, K,
            w.Kb.data() + Work<T>::sub_row(a0) * K, K, T(0), w.T2.data(), C);
    for (int64_t i = a0; i < a1; ++i)
      for (int64_t j = 0; j < a0; ++j) {
        const T p = w.T2[(i - a0) * C + j];
        w.P[i * C + j] = p;
        w.Akk[i * C + j] = w.bt[i] * p;
        if (full) w.Aqk[i * C + j] = w.T2[(m + i - a0) * C + j];
      }
  }
}

// Gathers the chunk's keys and decays: Gam, e^Gam, e^(Gam_last-Gam), K.e^Gam, K.e^(Gam_last-Gam); with
// state_only (what carries the state, given Vn) only K.e^(Gam_last-Gam) and e^Gam_last.
template <typename T>
void decays(Work<T>& w, const Chunk& ch, int64_t b, int64_t h, const KdaDims& d, const T* k, const T* g,
            bool state_only = false) {
  const int64_t n = ch.n, K = d.K;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t idx = (b * d.L + ch.t0 + i) * d.H + h;
    std::copy(k + idx * K, k + (idx + 1) * K, w.Kc.begin() + i * K);
    for (int64_t c = 0; c < K; ++c)
      w.Gm[i * K + c] = double(g[idx * K + c]) + (i > 0 ? w.Gm[(i - 1) * K + c] : 0.0);
  }
  const double* Gl = w.Gm.data() + (n - 1) * K;
  if (state_only)
    vexp_nonpos(Gl, w.eG.data() + (n - 1) * K, K);
  else
    vexp_nonpos(w.Gm.data(), w.eG.data(), n * K);
  for (int64_t i = 0; i < n; ++i) vexp_diff(Gl, w.Gm.data() + i * K, w.eL.data() + i * K, K);
  for (int64_t x = 0; x < n * K; ++x) w.Kl[x] = w.Kc[x] * w.eL[x];
  if (!state_only)
    for (int64_t x = 0; x < n * K; ++x) w.Kg[x] = w.Kc[x] * w.eG[x];
}

// Gathers chunk inputs and computes everything that does not depend on the incoming state:
// the decays, Q~.e^Gam, P, Akk, Aqk, W, U (Prep::State: no Q~.e^Gam, Aqk).
template <typename T>
void prepare(Work<T>& w, const Chunk& ch, int64_t b, int64_t h, const KdaDims& d, const T* q, const T* k,
             const T* v, const T* g, const T* beta, T scale, Prep mode) {
  const int64_t n = ch.n, K = d.K, V = d.V, LX = w.LX;
  const bool full = mode == Prep::Full;
  decays(w, ch, b, h, d, k, g);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t idx = (b * d.L + ch.t0 + i) * d.H + h;
    if (full)
      for (int64_t c = 0; c < K; ++c) {
        w.Qs[i * K + c] = scale * q[idx * K + c];
        w.Qg()[i * LX + c] = w.Qs[i * K + c] * w.eG[i * K + c];
      }
    std::copy(v + idx * V, v + (idx + 1) * V, w.Vc.begin() + i * V);
    w.bt[i] = beta[idx];
  }
  pairwise_forward(w, n, mode);
  T* WU = w.WU(n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < K; ++c) WU[i * LX + c] = w.bt[i] * w.Kg[i * K + c];
    for (int64_t j = 0; j < V; ++j) WU[i * LX + K + j] = w.bt[i] * w.Vc[i * V + j];
  }
  solve_unit_lower(false, n, LX, w.Akk.data(), w.C, WU, LX);
}

// Vn = U - W S.
template <typename T>
void pseudo_values(Work<T>& w, int64_t n, const T* S) {
  const T* WU = w.WU(n);
  for (int64_t i = 0; i < n; ++i) std::copy(WU + i * w.LX + w.K, WU + (i + 1) * w.LX, w.Vn.begin() + i * w.V);
  gemm<T>(Trans::N, Trans::N, n, w.V, w.K, T(-1), WU, w.LX, S, w.V, T(1), w.Vn.data(), w.V);
}

// S <- Diag(e^Gam_last) S + Kl^T Vn.
template <typename T>
void advance_state(Work<T>& w, int64_t n, T* S) {
  const T* eGl = w.eG.data() + (n - 1) * w.K;
  for (int64_t c = 0; c < w.K; ++c)
    for (int64_t j = 0; j < w.V; ++j) S[c * w.V + j] *= eGl[c];
  gemm<T>(Trans::T, Trans::N, w.K, w.V, n, T(1), w.Kl.data(), w.K, w.Vn.data(), w.V, T(1), S, w.V);
}

// Backward through the pairs of sub-chunk [a0, a1) with themselves (exponentials kept by prepare).
template <typename T>
void diagonal_block_backward(Work<T>& w, int64_t a0, int64_t a1) {
  const int64_t K = w.K, C = w.C;
  for (int64_t i = a0; i < a1; ++i) {
    const T* ki = w.Kc.data() + i * K;
    const T* qi = w.Qs.data() + i * K;
    T* dki = w.dk.data() + i * K;
    T* dqi = w.dq.data() + i * K;
    T* dGi = w.dGm.data() + i * K;
    for (int64_t j = a0; j < i; ++j) {
      const T dp = w.bt[i] * w.dM[i * C + j];
      const T da = w.dA[i * C + j];
      if (dp == T(0) && da == T(0)) continue;
      const T* kj = w.Kc.data() + j * K;
      T* dkj = w.dk.data() + j * K;
      T* dGj = w.dGm.data() + j * K;
      const T* ev = w.Ep.data() + (i * kSub + j - a0) * K;
#pragma omp simd
      for (int64_t c = 0; c < K; ++c) {
        const T e = ev[c];
        const T kje = kj[c] * e;
        dki[c] += dp * kje;
        dqi[c] += da * kje;
        const T s = (dp * ki[c] + da * qi[c]);
        dkj[c] += s * e;
        const T tt = s * kje;
        dGi[c] += tt;
        dGj[c] -= tt;
      }
    }
    // Diagonal of Aqk (P has none): zero exponent, no dGam term.
    const T da = w.dA[i * C + i];
    for (int64_t c = 0; c < K; ++c) {
      dqi[c] += da * ki[c];
      dki[c] += da * qi[c];
    }
  }
}

// Backward through the block rows a0..a1, columns 0..a0 of P and Aqk (e_ij = Af_i Bf_j), with
// D2 = [dP; dAqk] of the block (dP = Diag(beta) dM):
//   X; Y = D2 (K.Bf):  dk_i += Af_i X_i,  dq_i += Af_i Y_i,  dGam_i += (K.Af)_i X_i + (Q~.Af)_i Y_i
//   Z = D2^T [K.Af; Q~.Af]:  dk_j += Bf_j Z_j,  dGam_j -= (K.Bf)_j Z_j
template <typename T>
void offdiagonal_block_backward(Work<T>& w, int64_t a0, int64_t a1) {
  const int64_t K = w.K, C = w.C, m = a1 - a0;
  for (int64_t i = a0; i < a1; ++i)
    for (int64_t j = 0; j < a0; ++j) {
      w.D2[(i - a0) * C + j] = w.bt[i] * w.dM[i * C + j];
      w.D2[(m + i - a0) * C + j] = w.dA[i * C + j];
    }
  const T* KQ = w.KQ.data() + 2 * a0 * K;
  const T* bf = w.Bf.data() + Work<T>::sub_row(a0) * K;
  const T* kb = w.Kb.data() + Work<T>::sub_row(a0) * K;
  gemm<T>(Trans::N, Trans::N, 2 * m, K, a0, T(1), w.D2.data(), C, kb, K, T(0), w.XY.data(), K);
  gemm<T>(Trans::T, Trans::N, a0, K, 2 * m, T(1), w.D2.data(), C, KQ, K, T(0), w.Z.data(), K);
  for (int64_t i = a0; i < a1; ++i) {
    const T* x = w.XY.data() + (i - a0) * K;
    const T* y = x + m * K;
    const T* af = w.Af.data() + i * K;
    const T* ka = KQ + (i - a0) * K;
    const T* qa = ka + m * K;
    for (int64_t c = 0; c < K; ++c) {
      w.dk[i * K + c] += af[c] * x[c];
      w.dq[i * K + c] += af[c] * y[c];
      w.dGm[i * K + c] += ka[c] * x[c] + qa[c] * y[c];
    }
  }
  for (int64_t j = 0; j < a0; ++j)
    for (int64_t c = 0; c < K; ++c) {
      const T z = w.Z[j * K + c];
      w.dk[j * K + c] += bf[j * K + c] * z;
      w.dGm[j * K + c] -= kb[j * K + c] * z;
    }
}

// Backward through the pairwise terms of a chunk of n tokens: P (Akk = Diag(beta) P) and Aqk. Adds into
// w.dk, w.dq and w.dGm from w.dM (dL/dM) and w.dA (dL/dAqk).
template <typename T>
void pairwise_backward(Work<T>& w, int64_t n) {
  for (int64_t a0 = 0; a0 < n; a0 += kSub) {
    const int64_t a1 = std::min(a0 + kSub, n);
    diagonal_block_backward(w, a0, a1);
    if (a0 > 0) offdiagonal_block_backward(w, a0, a1);
  }
}

void check_args(const KdaDims& d, int64_t chunk, const char* what) {
  OLMO_CHECK(d.B >= 0 && d.L >= 0 && d.H > 0 && d.K > 0 && d.V > 0, what, ": bad dims B=", d.B, " L=", d.L,
             " H=", d.H, " K=", d.K, " V=", d.V);
  OLMO_CHECK(chunk > 0 && chunk <= 1024, what, ": chunk size must be in [1, 1024], got ", chunk);
}

}  // namespace

template <typename T>
void kda_chunk_forward(const T* q, const T* k, const T* v, const T* g, const T* beta, const int32_t* seg,
                       const KdaDims& d, T scale, T* o, int64_t chunk, T* vn) {
  check_args(d, chunk, "kda_chunk_forward");
  BlasSingleThread blas1;
  const int64_t L = d.L, H = d.H, K = d.K, V = d.V;
  const std::vector<int64_t> start = segment_starts(seg, d.B, L);
  parallel_for(d.B * H, [&](int64_t lo, int64_t hi) {
    FlushSubnormals ftz;
    Work<T> w(chunk, K, V, false);
    std::vector<T> S(static_cast<size_t>(K * V));
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      for (int64_t t = 0; t < L; ++t)
        if (start[b * L + t] < 0)
          for (T* x : {o, vn})
            if (x != nullptr)
              std::fill(x + ((b * L + t) * H + h) * V, x + ((b * L + t) * H + h + 1) * V, T(0));
      for (const Chunk& ch : row_chunks(start, b, L, chunk)) {
        if (ch.reset) std::fill(S.begin(), S.end(), T(0));
        prepare(w, ch, b, h, d, q, k, v, g, beta, scale, Prep::Full);
        const int64_t n = ch.n;
        // [Qg S; W S] in one GEMM; Vn = U - W S; O = Qg S + Aqk Vn.
        gemm<T>(Trans::N, Trans::N, 2 * n, V, K, T(1), w.X.data(), w.LX, S.data(), V, T(0), w.Y.data(), V);
        const T* WU = w.WU(n);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < V; ++j) w.Vn[i * V + j] = WU[i * w.LX + K + j] - w.Y[(n + i) * V + j];
        gemm<T>(Trans::N, Trans::N, n, V, n, T(1), w.Aqk.data(), chunk, w.Vn.data(), V, T(1), w.Y.data(), V);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t row = ((b * L + ch.t0 + i) * H + h) * V;
          std::copy(w.Y.begin() + i * V, w.Y.begin() + (i + 1) * V, o + row);
          if (vn != nullptr) std::copy(w.Vn.begin() + i * V, w.Vn.begin() + (i + 1) * V, vn + row);
        }
        advance_state(w, n, S.data());
      }
    }
  });
}

namespace {

// The inputs and outputs of the backward, and the (row, head) being processed.
template <typename T>
struct BwdArgs {
  const T *q, *k, *v, *g, *beta;
  const KdaDims& d;
  T scale;
  const T* dout;
  T *dq, *dk, *dv, *dg, *dbeta;
  const T* vn;  // the forward's pseudo-values, or nullptr (recomputed)
  int64_t b = 0, h = 0;
  int64_t idx(int64_t t) const { return (b * d.L + t) * d.H + h; }
  void prepare(Work<T>& w, const Chunk& ch, Prep mode) const {
    olmosft::kda::prepare(w, ch, b, h, d, q, k, v, g, beta, scale, mode);
  }
};

// Pass 1 over one document (chunks ch[0..nc), ch[0] its first): the state entering every chunk, Sin[ci]:
// S <- Diag(e^Gam_last) S + Kl^T Vn, with Vn the forward's (a.vn) or recomputed (Vn = U - W S).
template <typename T>
void document_states(Work<T>& w, const BwdArgs<T>& a, const Chunk* ch, int64_t nc, T* Sin) {
  const int64_t K = w.K, V = w.V, KV = K * V;
  std::fill(Sin, Sin + KV, T(0));
  for (int64_t ci = 1; ci < nc; ++ci) {
    T* S = Sin + ci * KV;
    const int64_t n = ch[ci - 1].n;
    if (a.vn == nullptr) {
      std::copy(S - KV, S, S);
      a.prepare(w, ch[ci - 1], Prep::State);
      pseudo_values(w, n, S);
      advance_state(w, n, S);
      continue;
    }
    decays(w, ch[ci - 1], a.b, a.h, a.d, a.k, a.g, true);
    const T* eGl = w.eG.data() + (n - 1) * K;
    for (int64_t c = 0; c < K; ++c)
      for (int64_t j = 0; j < V; ++j) S[c * V + j] = eGl[c] * S[c * V + j - KV];
    gemm<T>(Trans::T, Trans::N, K, V, n, T(1), w.Kl.data(), K, a.vn + a.idx(ch[ci - 1].t0) * V, a.d.H * V,
            T(1), S, V);
  }
}

// The elementwise terms of a chunk's gradient (dk, dq, dGam, dbeta, dv in w) from dWU = [dZw | dZu] (after
// the solve), dQg (R rows 0..n-1), dKl and dM; adds the last token's Gam terms into w.dGlast.
template <typename T>
void elementwise_backward(Work<T>& w, int64_t n) {
  const int64_t K = w.K, V = w.V, C = w.C, LX = w.LX;
  T* dGl = w.dGlast.data();
  for (int64_t i = 0; i < n; ++i) {
    const T bi = w.bt[i];
    const T *dzw = w.dWU.data() + i * LX, *dzu = dzw + K, *dqg = w.R.data() + i * K, *qg = w.Qg() + i * LX;
    const T *kg = w.Kg.data() + i * K, *kl = w.Kl.data() + i * K, *eg = w.eG.data() + i * K;
    const T *el = w.eL.data() + i * K, *dkl = w.dKl.data() + i * K, *vc = w.Vc.data() + i * V;
    const T *dm = w.dM.data() + i * C, *p = w.P.data() + i * C;
    T *dk = w.dk.data() + i * K, *dq = w.dq.data() + i * K, *dG = w.dGm.data() + i * K,
      *dv = w.dv.data() + i * V;
    const T last = i + 1 < n ? T(1) : T(0);  // Kl of the last token does not depend on Gam (zero exponent)
    T d1 = 0, d2 = 0, d3 = 0;
#pragma omp simd reduction(+ : d1)
    for (int64_t c = 0; c < K; ++c) {
      d1 += dzw[c] * kg[c];
      dk[c] = bi * dzw[c] * eg[c] + dkl[c] * el[c];
      dq[c] = dqg[c] * eg[c];
      const T t = last * (dkl[c] * kl[c]);
      dG[c] = (dqg[c] * qg[c] + bi * dzw[c] * kg[c]) - t;
      dGl[c] += t;
    }
#pragma omp simd reduction(+ : d2)
    for (int64_t j = 0; j < V; ++j) {
      d2 += dzu[j] * vc[j];
      dv[j] = bi * dzu[j];
    }
#pragma omp simd reduction(+ : d3)
    for (int64_t j = 0; j < i; ++j) d3 += dm[j] * p[j];
    w.db[i] = d1 + d2 + d3;
  }
}

// The state terms of a chunk's gradient, given S (entering the chunk), Gs = dL/d(state leaving it) and dO
// (DOV rows 0..n-1): dVn (DOV rows n..2n-1), dAqk, [dQg; -dW] (R), dKl, [dW | dU] (w.dWU, before the solve)
// and dL/d(state entering it) (w.Sd), dGlast's state term.
template <typename T>
void state_backward(Work<T>& w, int64_t n, const T* S, const T* Gs) {
  const int64_t K = w.K, V = w.V, C = w.C, LX = w.LX;
  T* dO = w.DOV.data();
  T* dVn = dO + n * V;
  // dVn = Aqk^T dO + Kl Gs;  dAqk = dO Vn^T (lower incl. diagonal);  [dQg; -dW] = [dO; dVn] S^T.
  gemm<T>(Trans::T, Trans::N, n, V, n, T(1), w.Aqk.data(), C, dO, V, T(0), dVn, V);
  gemm<T>(Trans::N, Trans::N, n, V, K, T(1), w.Kl.data(), K, Gs, V, T(1), dVn, V);
  gemm<T>(Trans::N, Trans::T, n, n, V, T(1), dO, V, w.Vn.data(), V, T(0), w.dA.data(), C);
  gemm<T>(Trans::N, Trans::T, 2 * n, K, V, T(1), dO, V, S, V, T(0), w.R.data(), K);
  // dW = -dVn S^T, dU = dVn, into dWU; then DOV = [dO; -dVn].
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < K; ++c) w.dWU[i * LX + c] = -w.R[(n + i) * K + c];
    for (int64_t j = 0; j < V; ++j) {
      w.dWU[i * LX + K + j] = dVn[i * V + j];
      dVn[i * V + j] = -dVn[i * V + j];
    }
  }
  // dS_in = Diag(e^Gam_last) Gs + [Qg; W]^T [dO; -dVn].
  const T* eGl = w.eG.data() + (n - 1) * K;
  T* Sd = w.Sd.data();
  for (int64_t c = 0; c < K; ++c) {
    T acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < V; ++j) {
      Sd[c * V + j] = eGl[c] * Gs[c * V + j];
      acc += Gs[c * V + j] * S[c * V + j];
    }
    w.dGlast[c] = eGl[c] * acc;
  }
  gemm<T>(Trans::T, Trans::N, K, V, 2 * n, T(1), w.X.data(), LX, dO, V, T(1), Sd, V);
  // dKl = Vn Gs^T.
  gemm<T>(Trans::N, Trans::T, n, K, V, T(1), w.Vn.data(), V, Gs, V, T(0), w.dKl.data(), K);
}

// Pass 2, one chunk: its gradients from dout and Gs = dL/d(state leaving the chunk), given S = the state
// entering it; leaves dL/d(state entering it) in w.Sd.
template <typename T>
void chunk_backward(Work<T>& w, const BwdArgs<T>& a, const Chunk& ch, const T* S, const T* Gs) {
  const int64_t n = ch.n, K = w.K, V = w.V, C = w.C, LX = w.LX;
  a.prepare(w, ch, Prep::Full);
  if (a.vn == nullptr)
    pseudo_values(w, n, S);
  else
    for (int64_t i = 0; i < n; ++i)
      std::copy(a.vn + a.idx(ch.t0 + i) * V, a.vn + (a.idx(ch.t0 + i) + 1) * V, w.Vn.begin() + i * V);
  for (int64_t i = 0; i < n; ++i)
    std::copy(a.dout + a.idx(ch.t0 + i) * V, a.dout + (a.idx(ch.t0 + i) + 1) * V, w.DOV.begin() + i * V);
  state_backward(w, n, S, Gs);
  // Through the UT solve: [dZw | dZu] = M^-T [dW | dU]; dM = -[dZw | dZu] [W | U]^T.
  solve_unit_lower(true, n, LX, w.Akk.data(), C, w.dWU.data(), LX);
  gemm<T>(Trans::N, Trans::T, n, n, LX, T(-1), w.dWU.data(), LX, w.WU(n), LX, T(0), w.dM.data(), C);
  elementwise_backward(w, n);
  T* dGl = w.dGm.data() + (n - 1) * K;
  for (int64_t c = 0; c < K; ++c) dGl[c] += w.dGlast[c];
  // Pairwise terms through P (Akk = Diag(beta) P) and Aqk.
  pairwise_backward(w, n);
  // Gam is a cumulative sum of g: dg = reverse cumulative sum of dGam. Scatter.
  for (int64_t i = n - 2; i >= 0; --i)
    for (int64_t c = 0; c < K; ++c) w.dGm[i * K + c] += w.dGm[(i + 1) * K + c];
  // At a document start the incoming state is zero, so the first token's decay has no effect: its
  // gradient is exactly zero (the sum above is zero up to rounding).
  if (ch.reset) std::fill(w.dGm.begin(), w.dGm.begin() + K, T(0));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = a.idx(ch.t0 + i);
    for (int64_t c = 0; c < K; ++c) {
      a.dq[id * K + c] = a.scale * w.dq[i * K + c];
      a.dk[id * K + c] = w.dk[i * K + c];
      a.dg[id * K + c] = w.dGm[i * K + c];
    }
    std::copy(w.dv.begin() + i * V, w.dv.begin() + (i + 1) * V, a.dv + id * V);
    a.dbeta[id] = w.db[i];
  }
}

// Zero gradients for the padding tokens of row a.b, head a.h.
template <typename T>
void zero_padding_grads(const BwdArgs<T>& a, const std::vector<int64_t>& start) {
  const int64_t K = a.d.K, V = a.d.V;
  for (int64_t t = 0; t < a.d.L; ++t)
    if (start[a.b * a.d.L + t] < 0) {
      const int64_t n = a.idx(t);
      std::fill(a.dq + n * K, a.dq + (n + 1) * K, T(0));
      std::fill(a.dk + n * K, a.dk + (n + 1) * K, T(0));
      std::fill(a.dg + n * K, a.dg + (n + 1) * K, T(0));
      std::fill(a.dv + n * V, a.dv + (n + 1) * V, T(0));
      a.dbeta[n] = 0;
    }
}

}  // namespace

// Per (row, head) and per document: pass 1 computes the state entering each of the document's chunks,
// pass 2 walks its chunks in reverse, carrying Gs = dL/d(state leaving the chunk).
template <typename T>
void kda_chunk_backward(const T* q, const T* k, const T* v, const T* g, const T* beta, const int32_t* seg,
                        const KdaDims& d, T scale, const T* dout, T* dq, T* dk, T* dv, T* dg, T* dbeta,
                        int64_t chunk, const T* vn) {
  check_args(d, chunk, "kda_chunk_backward");
  BlasSingleThread blas1;
  const int64_t L = d.L, H = d.H, KV = d.K * d.V;
  const std::vector<int64_t> start = segment_starts(seg, d.B, L);
  parallel_for(d.B * H, [&](int64_t lo, int64_t hi) {
    FlushSubnormals ftz;
    Work<T> w(chunk, d.K, d.V, true);
    std::vector<T> Sin, Gs(static_cast<size_t>(KV));
    BwdArgs<T> a{q, k, v, g, beta, d, scale, dout, dq, dk, dv, dg, dbeta, vn};
    for (int64_t bh = lo; bh < hi; ++bh) {
      a.b = bh / H;
      a.h = bh % H;
      zero_padding_grads(a, start);
      const std::vector<Chunk> chunks = row_chunks(start, a.b, L, chunk);
      for (size_t c0 = 0, c1; c0 < chunks.size(); c0 = c1) {
        for (c1 = c0 + 1; c1 < chunks.size() && !chunks[c1].reset;) ++c1;
        const int64_t nc = static_cast<int64_t>(c1 - c0);
        if (Sin.size() < static_cast<size_t>(nc * KV)) Sin.resize(static_cast<size_t>(nc * KV));
        document_states(w, a, chunks.data() + c0, nc, Sin.data());
        std::fill(Gs.begin(), Gs.end(), T(0));
        for (int64_t ci = nc - 1; ci >= 0; --ci) {
          chunk_backward(w, a, chunks[c0 + ci], Sin.data() + ci * KV, Gs.data());
          std::swap(w.Sd, Gs);  // dL/d(state entering it) = Gs of the chunk before
        }
      }
    }
  });
}

#define OLMOSFT_KDA_CHUNK(T)                                                                            \
  template void kda_chunk_forward<T>(const T*, const T*, const T*, const T*, const T*, const int32_t*,  \
                                     const KdaDims&, T, T*, int64_t, T*);                               \
  template void kda_chunk_backward<T>(const T*, const T*, const T*, const T*, const T*, const int32_t*, \
                                      const KdaDims&, T, const T*, T*, T*, T*, T*, T*, int64_t, const T*);
OLMOSFT_KDA_CHUNK(float)
OLMOSFT_KDA_CHUNK(double)
#undef OLMOSFT_KDA_CHUNK

}  // namespace olmosft::kda
