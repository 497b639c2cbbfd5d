// FlashAttention-2 style softmax attention on the CPU; see attention.h for the contract.
//
// Mask representation. Because each document is one contiguous run and the mask is causal (plus an
// optional window), the keys visible to a non-padding query i are exactly the interval [lo_i, i] with
// lo_i = max(start of i's run, i - W + 1). lo_i is non-decreasing over non-padding queries, so:
//   - a query block [m0, m1) needs key tiles from lo(first valid query) / Bk to (last valid query) / Bk;
//   - a key tile [n0, n1) is needed by query blocks from n0 / Bq while lo(first valid query) <= n1 - 1;
//   - inside a tile, row i's visible columns are one interval: no per-element mask tests;
//   - a tile with no padding query, lo(last query) <= n0 and n1 - 1 <= m0 is entirely visible.
//
// Work split. Forward: one item = (row b, kv head j, query block m) and all G query heads of kv head j
// are stacked into one [G*Bq, D] tile, so each K/V tile is read once per group. Backward: one item =
// (row b, kv head j, key-block class s): the item owns dK/dV of its key tiles (no races) and adds into dQ
// of the group's query heads of row b. With at least as many (b, j) units as threads, s has one value
// and dQ rows are also owned (no races, no extra memory); otherwise the key tiles of a unit are dealt
// round-robin to S classes and classes s >= 1 accumulate dQ into private buffers summed at the end.
#include "kernels/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/vexp.h"

namespace olmosft {

namespace {

AttentionTileBackend g_backend = AttentionTileBackend::kBlas;

constexpr int64_t kBq = kAttnBlockQ;
constexpr int64_t kBk = kAttnBlockK;
constexpr size_t kAlign = 64;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// ---- exp over a row -----------------------------------------------------------------------------------
// exp_sub_sum(x, n, sub): x[c] = exp(x[c] - sub) for c < n, returns the sum. float: vexp.h (Cody-Waite +
// minimax polynomial, AVX-512 or AVX2 chosen at run time, at most 0.86 ulp from exp over all floats, -inf
// and underflowing arguments give 0; a row's bits do not depend on the thread split). double: std::exp
// (the double path exists for finite-difference tests).
inline float exp_sub_sum(float* x, int64_t n, float sub) { return vexp_sub_sum(x, n, sub); }
inline double exp_sub_sum(double* x, int64_t n, double sub) {
  double sum = 0;
  for (int64_t c = 0; c < n; ++c) {
    x[c] = std::exp(x[c] - sub);
    sum += x[c];
  }
  return sum;
}
inline float exp_one(float x) { return vexp1(x); }
inline double exp_one(double x) { return std::exp(x); }

// ---- tile products -----------------------------------------------------------------------------------
// C[M,N] = alpha * op(A) op(B) + beta * C, row-major. ta: A is stored [K,M]; tb: B is stored [N,K].
void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
               int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha,
              A, lda, B, ldb, beta, C, ldc);
}
void blas_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
               int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha,
              A, lda, B, ldb, beta, C, ldc);
}

// Register-blocked loops (GCC vector extensions, so the same source serves float and double and any
// vector width): a 4 x (2 vectors) block of C stays in registers while k runs; B must be contiguous along
// N, so a transposed B is first packed into `pack` ([K, N]).
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;  // SSE2 baseline (OLMOSFT_NATIVE=OFF builds)
#endif
template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes)));
};

template <typename T, bool TA>
void loops_gemm_impl(int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T* C, int ldc) {
  using V = typename VecOf<T>::type;
  constexpr int L = kVecBytes / sizeof(T);
  constexpr int MR = 4, NR = 2 * L;
  auto a_at = [&](int i, int k) {
    if constexpr (TA)
      return A[static_cast<size_t>(k) * lda + i];
    else
      return A[static_cast<size_t>(i) * lda + k];
  };
  auto load = [](const T* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  };
  auto add_store = [&](T* p, V acc) {
    V c = load(p);
    c += alpha * acc;
    std::memcpy(p, &c, sizeof(V));
  };
  int i0 = 0;
  for (; i0 + MR <= M; i0 += MR) {
    int j0 = 0;
    for (; j0 + NR <= N; j0 += NR) {
      V c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
      for (int k = 0; k < K; ++k) {
        const T* b = B + static_cast<size_t>(k) * ldb + j0;
        const V b0 = load(b), b1 = load(b + L);
        const T a0 = a_at(i0, k), a1 = a_at(i0 + 1, k), a2 = a_at(i0 + 2, k), a3 = a_at(i0 + 3, k);
        c00 += a0 * b0;
        c01 += a0 * b1;
        c10 += a1 * b0;
        c11 += a1 * b1;
        c20 += a2 * b0;
        c21 += a2 * b1;
        c30 += a3 * b0;
        c31 += a3 * b1;
      }
      T* c = C + static_cast<size_t>(i0) * ldc + j0;
      add_store(c, c00);
      add_store(c + L, c01);
      add_store(c + ldc, c10);
      add_store(c + ldc + L, c11);
      add_store(c + 2 * ldc, c20);
      add_store(c + 2 * ldc + L, c21);
      add_store(c + 3 * ldc, c30);
      add_store(c + 3 * ldc + L, c31);
    }
    if (j0 < N)
      for (int r = 0; r < MR; ++r) {
        T* c = C + static_cast<size_t>(i0 + r) * ldc;
        for (int k = 0; k < K; ++k) {
          const T a = alpha * a_at(i0 + r, k);
          const T* b = B + static_cast<size_t>(k) * ldb;
#pragma omp simd
          for (int j = j0; j < N; ++j) c[j] += a * b[j];
        }
      }
  }
  for (; i0 < M; ++i0) {
    T* c = C + static_cast<size_t>(i0) * ldc;
    for (int k = 0; k < K; ++k) {
      const T a = alpha * a_at(i0, k);
      const T* b = B + static_cast<size_t>(k) * ldb;
#pragma omp simd
      for (int j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

template <typename T>
void loops_gemm(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
                T beta, T* C, int ldc, T* pack) {
  if (tb) {
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) pack[static_cast<size_t>(k) * N + j] = B[static_cast<size_t>(j) * ldb + k];
    B = pack;
    ldb = N;
  }
  for (int i = 0; i < M; ++i) {
    T* c = C + static_cast<size_t>(i) * ldc;
    if (beta == T(0)) {
      std::fill_n(c, N, T(0));
    } else if (beta != T(1)) {
      for (int j = 0; j < N; ++j) c[j] *= beta;
    }
  }
  if (ta)
    loops_gemm_impl<T, true>(M, N, K, alpha, A, lda, B, ldb, C, ldc);
  else
    loops_gemm_impl<T, false>(M, N, K, alpha, A, lda, B, ldb, C, ldc);
}

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, T* pack) {
  if (M <= 0 || N <= 0) return;
  if (g_backend == AttentionTileBackend::kBlas)
    blas_gemm(ta, tb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
  else
    loops_gemm<T>(ta, tb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc), pack);
}

// ---- workspace layout ---------------------------------------------------------------------------------
struct BlockMeta {
  int32_t first_lo;    // lo of the first valid query in the block
  int32_t last_lo;     // lo of the last valid query
  int32_t last_valid;  // index of the last valid query; -1 when the block is all padding
  int32_t all_valid;   // 1 when the block has no padding query
};

struct Carver {
  std::byte* base;
  size_t used = 0;
  template <typename U>
  U* take(size_t n) {
    U* p = base ? reinterpret_cast<U*>(base + used) : nullptr;
    used += align_up(n * sizeof(U));
    return p;
  }
};

int resolve_threads(const AttentionConfig& c) {
  return c.threads > 0 ? c.threads : std::max(1, num_threads());
}

int64_t num_qblocks(const AttentionConfig& c) { return (c.seq + kBq - 1) / kBq; }
int64_t num_kblocks(const AttentionConfig& c) { return (c.seq + kBk - 1) / kBk; }
int64_t group(const AttentionConfig& c) { return c.heads / c.kv_heads; }

// Number of key-block classes per (row, kv head) unit in the backward (see the file comment).
int64_t backward_splits(const AttentionConfig& c, int nt) {
  int64_t units = c.batch * c.kv_heads;
  int64_t s = units >= nt ? 1 : (nt + units - 1) / units;
  return std::max<int64_t>(1, std::min(s, num_kblocks(c)));
}

struct Shared {
  int32_t* lo;       // [B*T]
  BlockMeta* meta;   // [B*nqb]
  int32_t* scratch;  // [T] for the segment check
};

template <typename T>
Shared carve_shared(Carver& cv, const AttentionConfig& c) {
  Shared s;
  s.lo = cv.take<int32_t>(static_cast<size_t>(c.batch * c.seq));
  s.meta = cv.take<BlockMeta>(static_cast<size_t>(c.batch * num_qblocks(c)));
  s.scratch = cv.take<int32_t>(static_cast<size_t>(c.seq));
  return s;
}

template <typename T>
struct FwdTiles {
  T *qs, *s, *oacc, *m, *l, *pack;
};
template <typename T>
FwdTiles<T> carve_fwd_tiles(Carver& cv, const AttentionConfig& c) {
  size_t gr = static_cast<size_t>(group(c) * kBq);
  FwdTiles<T> t;
  t.qs = cv.take<T>(gr * c.head_dim);
  t.s = cv.take<T>(gr * kBk);
  t.oacc = cv.take<T>(gr * c.v_head_dim);
  t.m = cv.take<T>(gr);
  t.l = cv.take<T>(gr);
  t.pack = cv.take<T>(static_cast<size_t>(std::max(c.head_dim, c.v_head_dim) * std::max<int64_t>(kBk, gr)));
  return t;
}

template <typename T>
struct BwdTiles {
  T *qs, *dout, *lse, *dvec, *p, *dp, *dk, *dv, *pack;
};
template <typename T>
BwdTiles<T> carve_bwd_tiles(Carver& cv, const AttentionConfig& c) {
  size_t gr = static_cast<size_t>(group(c) * kBq);
  BwdTiles<T> t;
  t.qs = cv.take<T>(gr * c.head_dim);
  t.dout = cv.take<T>(gr * c.v_head_dim);
  t.lse = cv.take<T>(gr);
  t.dvec = cv.take<T>(gr);
  t.p = cv.take<T>(gr * kBk);
  t.dp = cv.take<T>(gr * kBk);
  t.dk = cv.take<T>(static_cast<size_t>(kBk * c.head_dim));
  t.dv = cv.take<T>(static_cast<size_t>(kBk * c.v_head_dim));
  t.pack = cv.take<T>(static_cast<size_t>(std::max(c.head_dim, c.v_head_dim) * std::max<int64_t>(kBk, gr)));
  return t;
}

// Thread tid's tiles: the threads' tile sets follow one another from cv's position, each carved alike.
template <typename Tiles>
Tiles thread_tiles(const Carver& cv, const AttentionConfig& c, int tid,
                   Tiles (*carve)(Carver&, const AttentionConfig&)) {
  Carver one{nullptr};
  carve(one, c);  // one set's bytes
  Carver at{cv.base, cv.used + static_cast<size_t>(tid) * one.used};
  return carve(at, c);
}

// Fills lo[] and the per-query-block metadata for every row; validates the segment ids.
void build_mask_meta(const AttentionConfig& c, const int32_t* seg, const Shared& sh) {
  const int64_t T = c.seq, nqb = num_qblocks(c);
  for (int64_t b = 0; b < c.batch; ++b) {
    const int32_t* sg = seg + b * T;
    int32_t* lo = sh.lo + b * T;
    int64_t start = 0, nruns = 0;
    for (int64_t i = 0; i < T; ++i) {
      if (sg[i] < 0) {
        lo[i] = -1;
        continue;
      }
      if (i == 0 || sg[i - 1] != sg[i]) {
        start = i;
        sh.scratch[nruns++] = sg[i];
      }
      int64_t l = start;
      if (c.window > 0) l = std::max(l, i - c.window + 1);
      lo[i] = static_cast<int32_t>(l);
    }
    std::sort(sh.scratch, sh.scratch + nruns);
    for (int64_t r = 1; r < nruns; ++r)
      OLMO_CHECK(sh.scratch[r] != sh.scratch[r - 1], "attention: row ", b, ": segment id ", sh.scratch[r],
                 " appears in more than one run; each document must be one contiguous run of its id "
                 "(negative ids are padding)");
    for (int64_t m = 0; m < nqb; ++m) {
      BlockMeta& bm = sh.meta[b * nqb + m];
      bm = {0, 0, -1, 1};
      const int64_t m0 = m * kBq, m1 = std::min(T, m0 + kBq);
      bool first = true;
      for (int64_t i = m0; i < m1; ++i) {
        if (lo[i] < 0) {
          bm.all_valid = 0;
          continue;
        }
        if (first) bm.first_lo = lo[i];
        first = false;
        bm.last_lo = lo[i];
        bm.last_valid = static_cast<int32_t>(i);
      }
    }
  }
}

}  // namespace

void set_attention_tile_backend(AttentionTileBackend b) { g_backend = b; }
AttentionTileBackend attention_tile_backend() { return g_backend; }

void attention_validate(const AttentionConfig& c) {
  OLMO_CHECK(c.batch >= 1, "attention: batch must be >= 1, got ", c.batch);
  OLMO_CHECK(c.seq >= 1, "attention: seq must be >= 1, got ", c.seq);
  OLMO_CHECK(c.seq < (int64_t(1) << 30), "attention: seq ", c.seq, " too large (int32 positions)");
  OLMO_CHECK(c.heads >= 1 && c.kv_heads >= 1, "attention: heads (", c.heads, ") and kv_heads (", c.kv_heads,
             ") must be >= 1");
  OLMO_CHECK(c.heads % c.kv_heads == 0, "attention: heads (", c.heads, ") must be a multiple of kv_heads (",
             c.kv_heads, ")");
  OLMO_CHECK(c.head_dim >= 1 && c.v_head_dim >= 1, "attention: head_dim (", c.head_dim, ") and v_head_dim (",
             c.v_head_dim, ") must be >= 1");
  OLMO_CHECK(std::isfinite(c.scale), "attention: scale must be finite, got ", c.scale);
  OLMO_CHECK(c.threads >= 0, "attention: threads must be >= 0, got ", c.threads);
}

void attention_check_segments(const int32_t* seg, int64_t T, int64_t row) {
  // Same rule as build_mask_meta, without a workspace (used by tests and callers that want an early check).
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < T; ++i)
    if (seg[i] >= 0 && (i == 0 || seg[i - 1] != seg[i])) ids.push_back(seg[i]);
  std::sort(ids.begin(), ids.end());
  for (size_t r = 1; r < ids.size(); ++r)
    OLMO_CHECK(ids[r] != ids[r - 1], "attention: row ", row, ": segment id ", ids[r],
               " appears in more than one run; each document must be one contiguous run of its id "
               "(negative ids are padding)");
}

template <typename T>
size_t attention_forward_workspace_bytes(const AttentionConfig& c) {
  attention_validate(c);
  Carver cv{nullptr};
  carve_shared<T>(cv, c);
  for (int t = 0; t < resolve_threads(c); ++t) carve_fwd_tiles<T>(cv, c);
  return cv.used + kAlign;  // + slack so an unaligned caller pointer can be aligned inside
}

template <typename T>
size_t attention_backward_workspace_bytes(const AttentionConfig& c) {
  attention_validate(c);
  const int nt = resolve_threads(c);
  Carver cv{nullptr};
  carve_shared<T>(cv, c);
  cv.take<T>(static_cast<size_t>(c.batch * c.heads * c.seq));  // D_i = rowsum(dO * O)
  const int64_t splits = backward_splits(c, nt);
  cv.take<T>(static_cast<size_t>((splits - 1) * c.batch * c.seq * c.heads * c.head_dim));  // private dQ
  for (int t = 0; t < nt; ++t) carve_bwd_tiles<T>(cv, c);
  return cv.used + kAlign;
}

namespace {
std::byte* align_ws(void* ws, size_t bytes, size_t need, const char* what) {
  OLMO_CHECK(ws != nullptr, "attention ", what, ": workspace is null (need ", need, " bytes)");
  OLMO_CHECK(bytes >= need, "attention ", what, ": workspace has ", bytes, " bytes, need ", need,
             " (query attention_", what, "_workspace_bytes with the same config and threads)");
  auto p = reinterpret_cast<uintptr_t>(ws);
  return reinterpret_cast<std::byte*>((p + kAlign - 1) / kAlign * kAlign);
}

// Visible column interval [clo, chi) of row i inside key tile [n0, n1).
inline void visible_cols(int32_t lo_i, int64_t i, int64_t n0, int64_t n1, int64_t& clo, int64_t& chi) {
  clo = std::max<int64_t>(lo_i, n0) - n0;
  chi = std::min<int64_t>(i + 1, n1) - n0;
  if (lo_i < 0 || chi <= clo) clo = chi = 0;
}
}  // namespace

template <typename T>
void attention_forward(const AttentionConfig& c, const T* q, const T* k, const T* v, const int32_t* seg, T* o,
                       T* lse, void* workspace, size_t workspace_bytes) {
  const size_t need = attention_forward_workspace_bytes<T>(c);
  Carver cv{align_ws(workspace, workspace_bytes, need, "forward")};
  const int nt = resolve_threads(c);
  const Shared sh = carve_shared<T>(cv, c);
  build_mask_meta(c, seg, sh);

  const int64_t T_ = c.seq, H = c.heads, Hkv = c.kv_heads, D = c.head_dim, Dv = c.v_head_dim, G = group(c);
  const int64_t nqb = num_qblocks(c);
  const int64_t nitems = c.batch * Hkv * nqb;
  const T scale = static_cast<T>(c.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  BlasSingleThread blas_guard;  // tile products are small: OpenBLAS must not fan them out

#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num();
    const FwdTiles<T> w = thread_tiles(cv, c, tid, carve_fwd_tiles<T>);

#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < nitems; ++item) {
      // Largest query blocks (most key tiles under causality) first.
      const int64_t m = nqb - 1 - item % nqb;
      const int64_t j = (item / nqb) % Hkv;
      const int64_t b = item / (nqb * Hkv);
      const int64_t m0 = m * kBq, m1 = std::min(T_, m0 + kBq), R = m1 - m0, GR = G * R;
      const BlockMeta bm = sh.meta[b * nqb + m];
      const int32_t* lo = sh.lo + b * T_;
      if (bm.last_valid < 0) {
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = j * G + g;
          for (int64_t i = m0; i < m1; ++i) {
            std::fill_n(o + ((b * T_ + i) * H + h) * Dv, Dv, T(0));
            lse[(b * H + h) * T_ + i] = neg_inf;
          }
        }
        continue;
      }
      // Pack the group's queries, pre-scaled: row r = g * R + (i - m0).
      for (int64_t g = 0; g < G; ++g)
        for (int64_t ii = 0; ii < R; ++ii) {
          const T* src = q + ((b * T_ + m0 + ii) * H + j * G + g) * D;
          T* dst = w.qs + (g * R + ii) * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * scale;
        }
      std::fill_n(w.m, GR, neg_inf);
      std::fill_n(w.l, GR, T(0));
      std::fill_n(w.oacc, GR * Dv, T(0));
      const int64_t nlo = bm.first_lo / kBk, nhi = bm.last_valid / kBk;
      for (int64_t n = nlo; n <= nhi; ++n) {
        const int64_t n0 = n * kBk, n1 = std::min(T_, n0 + kBk), C = n1 - n0;
        const bool full = bm.all_valid && bm.last_lo <= n0 && n1 - 1 <= m0;
        const T* kt = k + ((b * T_ + n0) * Hkv + j) * D;
        const T* vt = v + ((b * T_ + n0) * Hkv + j) * Dv;
        gemm<T>(false, true, GR, C, D, T(1), w.qs, D, kt, Hkv * D, T(0), w.s, kBk, w.pack);
        for (int64_t r = 0; r < GR; ++r) {
          const int64_t i = m0 + r % R;
          T* srow = w.s + r * kBk;
          int64_t clo = 0, chi = C;
          if (!full) visible_cols(lo[i], i, n0, n1, clo, chi);
          if (clo >= chi) {
            std::fill_n(srow, C, T(0));
            continue;
          }
          T mx = srow[clo];
#pragma omp simd reduction(max : mx)
          for (int64_t cc = clo + 1; cc < chi; ++cc) mx = std::max(mx, srow[cc]);
          const T m_old = w.m[r];
          const T m_new = std::max(m_old, mx);
          const T alpha = m_old == neg_inf ? T(0) : exp_one(m_old - m_new);
          for (int64_t cc = 0; cc < clo; ++cc) srow[cc] = T(0);
          const T sum = exp_sub_sum(srow + clo, chi - clo, m_new);
          for (int64_t cc = chi; cc < C; ++cc) srow[cc] = T(0);
          w.m[r] = m_new;
          w.l[r] = w.l[r] * alpha + sum;
          if (alpha != T(1)) {
            T* orow = w.oacc + r * Dv;
#pragma omp simd
            for (int64_t d = 0; d < Dv; ++d) orow[d] *= alpha;
          }
        }
        gemm<T>(false, false, GR, Dv, C, T(1), w.s, kBk, vt, Hkv * Dv, T(1), w.oacc, Dv, w.pack);
      }
      for (int64_t r = 0; r < GR; ++r) {
        const int64_t g = r / R, i = m0 + r % R, h = j * G + g;
        T* dst = o + ((b * T_ + i) * H + h) * Dv;
        if (lo[i] < 0 || w.l[r] == T(0)) {
          std::fill_n(dst, Dv, T(0));
          lse[(b * H + h) * T_ + i] = neg_inf;
          continue;
        }
        const T inv = T(1) / w.l[r];
        const T* src = w.oacc + r * Dv;
        for (int64_t d = 0; d < Dv; ++d) dst[d] = src[d] * inv;
        lse[(b * H + h) * T_ + i] = w.m[r] + std::log(w.l[r]);
      }
    }
  }
}

template <typename T>
void attention_backward(const AttentionConfig& c, const T* q, const T* k, const T* v, const int32_t* seg,
                        const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv, void* workspace,
                        size_t workspace_bytes) {
  const size_t need = attention_backward_workspace_bytes<T>(c);
  Carver cv{align_ws(workspace, workspace_bytes, need, "backward")};
  const int nt = resolve_threads(c);
  const int64_t T_ = c.seq, H = c.heads, Hkv = c.kv_heads, D = c.head_dim, Dv = c.v_head_dim, G = group(c);
  const int64_t nqb = num_qblocks(c), nkb = num_kblocks(c);
  const Shared sh = carve_shared<T>(cv, c);
  T* dvec_all = cv.take<T>(static_cast<size_t>(c.batch * H * T_));
  const int64_t splits = backward_splits(c, nt);
  const size_t dq_elems = static_cast<size_t>(c.batch * T_ * H * D);
  T* dq_priv = cv.take<T>((splits - 1) * dq_elems);
  build_mask_meta(c, seg, sh);

  const T scale = static_cast<T>(c.scale);
  const int64_t ntok = c.batch * T_;
  BlasSingleThread blas_guard;  // tile products are small: OpenBLAS must not fan them out

#pragma omp parallel num_threads(nt)
  {
    // D_i = rowsum(dO * O), layout [B, H, T] like lse; zero for padding. Zero dQ (it is accumulated).
#pragma omp for schedule(static)
    for (int64_t t = 0; t < ntok; ++t) {
      const int64_t b = t / T_, i = t % T_;
      const bool pad = sh.lo[t] < 0;
      for (int64_t h = 0; h < H; ++h) {
        const T* a = dout + (t * H + h) * Dv;
        const T* bb = o + (t * H + h) * Dv;
        T s = 0;
        if (!pad)
          for (int64_t d = 0; d < Dv; ++d) s += a[d] * bb[d];
        dvec_all[(b * H + h) * T_ + i] = s;
      }
      std::fill_n(dq + t * H * D, H * D, T(0));
      for (int64_t s = 1; s < splits; ++s) std::fill_n(dq_priv + (s - 1) * dq_elems + t * H * D, H * D, T(0));
    }

    const int tid = omp_get_thread_num();
    const BwdTiles<T> w = thread_tiles(cv, c, tid, carve_bwd_tiles<T>);

    const int64_t nitems = c.batch * Hkv * splits;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < nitems; ++item) {
      const int64_t s = item % splits;
      const int64_t j = (item / splits) % Hkv;
      const int64_t b = item / (splits * Hkv);
      const int32_t* lo = sh.lo + b * T_;
      T* dq_dst = s == 0 ? dq : dq_priv + (s - 1) * dq_elems;
      for (int64_t n = s; n < nkb; n += splits) {
        const int64_t n0 = n * kBk, n1 = std::min(T_, n0 + kBk), C = n1 - n0;
        const T* kt = k + ((b * T_ + n0) * Hkv + j) * D;
        const T* vt = v + ((b * T_ + n0) * Hkv + j) * Dv;
        std::fill_n(w.dk, C * D, T(0));
        std::fill_n(w.dv, C * Dv, T(0));
        for (int64_t m = n0 / kBq; m < nqb; ++m) {
          const BlockMeta bm = sh.meta[b * nqb + m];
          if (bm.last_valid < 0 || bm.last_valid < n0) continue;
          if (bm.first_lo > n1 - 1) break;  // lo is non-decreasing: no later block sees this tile
          const int64_t m0 = m * kBq, m1 = std::min(T_, m0 + kBq), R = m1 - m0, GR = G * R;
          const bool full = bm.all_valid && bm.last_lo <= n0 && n1 - 1 <= m0;
          for (int64_t g = 0; g < G; ++g) {
            const int64_t h = j * G + g;
            for (int64_t ii = 0; ii < R; ++ii) {
              const int64_t t = b * T_ + m0 + ii, r = g * R + ii;
              const T* qsrc = q + (t * H + h) * D;
              T* qdst = w.qs + r * D;
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) qdst[d] = qsrc[d] * scale;
              T* ddst = w.dout + r * Dv;
              if (lo[m0 + ii] < 0) {
                std::fill_n(ddst, Dv, T(0));
              } else {
                std::copy_n(dout + (t * H + h) * Dv, Dv, ddst);
              }
              w.lse[r] = lse[(b * H + h) * T_ + m0 + ii];
              w.dvec[r] = dvec_all[(b * H + h) * T_ + m0 + ii];
            }
          }
          // S = Qs K^T, P = exp(S - lse) on the visible interval.
          gemm<T>(false, true, GR, C, D, T(1), w.qs, D, kt, Hkv * D, T(0), w.p, kBk, w.pack);
          for (int64_t r = 0; r < GR; ++r) {
            const int64_t i = m0 + r % R;
            T* prow = w.p + r * kBk;
            int64_t clo = 0, chi = C;
            if (!full) visible_cols(lo[i], i, n0, n1, clo, chi);
            for (int64_t cc = 0; cc < clo; ++cc) prow[cc] = T(0);
            if (chi > clo) exp_sub_sum(prow + clo, chi - clo, w.lse[r]);
            for (int64_t cc = std::max(chi, clo); cc < C; ++cc) prow[cc] = T(0);
          }
          // dV += P^T dO
          gemm<T>(true, false, C, Dv, GR, T(1), w.p, kBk, w.dout, Dv, T(1), w.dv, Dv, w.pack);
          // dP = dO V^T; dS = P * (dP - D_i)   (P = 0 outside the visible interval)
          gemm<T>(false, true, GR, C, Dv, T(1), w.dout, Dv, vt, Hkv * Dv, T(0), w.dp, kBk, w.pack);
          for (int64_t r = 0; r < GR; ++r) {
            T* prow = w.p + r * kBk;
            const T* dprow = w.dp + r * kBk;
            const T dd = w.dvec[r];
#pragma omp simd
            for (int64_t cc = 0; cc < C; ++cc) prow[cc] = prow[cc] * (dprow[cc] - dd);
          }
          // dK += dS^T Qs   (Qs already carries the scale)
          gemm<T>(true, false, C, D, GR, T(1), w.p, kBk, w.qs, D, T(1), w.dk, D, w.pack);
          // dQ += scale * dS K, straight into the strided dq rows of each head of the group.
          for (int64_t g = 0; g < G; ++g) {
            const int64_t h = j * G + g;
            gemm<T>(false, false, R, D, C, scale, w.p + g * R * kBk, kBk, kt, Hkv * D, T(1),
                    dq_dst + ((b * T_ + m0) * H + h) * D, H * D, w.pack);
          }
        }
        for (int64_t cc = 0; cc < C; ++cc) {
          std::copy_n(w.dk + cc * D, D, dk + ((b * T_ + n0 + cc) * Hkv + j) * D);
          std::copy_n(w.dv + cc * Dv, Dv, dv + ((b * T_ + n0 + cc) * Hkv + j) * Dv);
        }
      }
    }

    if (splits > 1) {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < ntok; ++t)
        for (int64_t s = 1; s < splits; ++s) {
          const T* src = dq_priv + (s - 1) * dq_elems + t * H * D;
          T* dst = dq + t * H * D;
          for (int64_t e = 0; e < H * D; ++e) dst[e] += src[e];
        }
    }
  }
}

#define OLMOSFT_ATTN_INSTANTIATE(T)                                                                         \
  template size_t attention_forward_workspace_bytes<T>(const AttentionConfig&);                             \
  template size_t attention_backward_workspace_bytes<T>(const AttentionConfig&);                            \
  template void attention_forward<T>(const AttentionConfig&, const T*, const T*, const T*, const int32_t*,  \
                                     T*, T*, void*, size_t);                                                \
  template void attention_backward<T>(const AttentionConfig&, const T*, const T*, const T*, const int32_t*, \
                                      const T*, const T*, const T*, T*, T*, T*, void*, size_t);
OLMOSFT_ATTN_INSTANTIATE(float)
OLMOSFT_ATTN_INSTANTIATE(double)
#undef OLMOSFT_ATTN_INSTANTIATE

}  // namespace olmosft
