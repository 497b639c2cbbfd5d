#include "kernels/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/gemm_onednn.h"

namespace olmosft {

namespace {
std::atomic<bool> g_count_flops{false};
std::atomic<uint64_t> g_flops{0};
std::atomic<GemmLib> g_fp32_lib{GemmLib::OpenBLAS};
std::atomic<ComputeDtype> g_compute{ComputeDtype::F32};

const char* tname(Trans t) { return t == Trans::N ? "N" : "T"; }

void check_gemm_args(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
                     const void* B, int64_t ldb, const void* C, int64_t ldc) {
  OLMO_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  OLMO_CHECK(
      M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
      "gemm: size or leading dimension exceeds the 32-bit BLAS interface (M=", M, " N=", N, " K=", K,
      " lda=", lda, " ldb=", ldb, " ldc=", ldc, ")");
  // Stored shapes (row-major): A is [M,K] (N) or [K,M] (T); B is [K,N] (N) or [N,K] (T); C is [M,N].
  const int64_t a_cols = ta == Trans::N ? K : M, b_cols = tb == Trans::N ? N : K;
  OLMO_CHECK(lda >= std::max<int64_t>(1, a_cols), "gemm(", tname(ta), tname(tb), "): lda=", lda,
             " is smaller than A's row length ", a_cols, " (M=", M, " N=", N, " K=", K, ")");
  OLMO_CHECK(ldb >= std::max<int64_t>(1, b_cols), "gemm(", tname(ta), tname(tb), "): ldb=", ldb,
             " is smaller than B's row length ", b_cols, " (M=", M, " N=", N, " K=", K, ")");
  OLMO_CHECK(ldc >= std::max<int64_t>(1, N), "gemm(", tname(ta), tname(tb), "): ldc=", ldc,
             " is smaller than C's row length ", N);
  if (M > 0 && N > 0) {
    OLMO_CHECK(C != nullptr, "gemm: C is null");
    if (K > 0) OLMO_CHECK(A != nullptr && B != nullptr, "gemm: A or B is null");
  }
}

// The cases no library is called for: nothing to do, or C = beta*C (BLAS would reject lda=0 for K=0).
// Otherwise counts the FLOPs and returns false.
template <typename T>
bool gemm_trivial(int64_t M, int64_t N, int64_t K, T alpha, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return true;
  if (K == 0 || alpha == T(0)) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return true;
  }
  if (g_count_flops.load(std::memory_order_relaxed))
    g_flops.fetch_add(2 * uint64_t(M) * uint64_t(N) * uint64_t(K), std::memory_order_relaxed);
  return false;
}

template <typename T>
void gemm_unchecked(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                    const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (gemm_trivial(M, N, K, alpha, beta, C, ldc)) return;
  const CBLAS_TRANSPOSE cta = ta == Trans::N ? CblasNoTrans : CblasTrans;
  const CBLAS_TRANSPOSE ctb = tb == Trans::N ? CblasNoTrans : CblasTrans;
  if constexpr (std::is_same_v<T, float>) {
    if (g_fp32_lib.load(std::memory_order_relaxed) == GemmLib::OneDNN)
      onednn::matmul_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
      cblas_sgemm(CblasRowMajor, cta, ctb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C,
                  int(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, cta, ctb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C,
                int(ldc));
  }
}

std::atomic<Bf16Weights*> g_held{nullptr};

// A stored rows x cols (leading dimension ld) as dense bf16 (leading dimension cols), into a per-thread
// buffer.
const uint16_t* to_bf16(const float* X, int64_t rows, int64_t cols, int64_t ld, std::vector<uint16_t>& buf) {
  buf.resize(static_cast<size_t>(rows * cols));
  uint16_t* out = buf.data();
  if (ld == cols) {  // one block (every GEMM of the models): core's conversion, threaded when large
    f32_to_bf16(X, out, static_cast<size_t>(rows * cols));
    return out;
  }
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16) && !omp_in_parallel())
  for (int64_t r = 0; r < rows; ++r) f32_to_bf16(X + r * ld, out + r * cols, static_cast<size_t>(cols));
  return out;
}

void gemm_bf16_unchecked(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                         int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (gemm_trivial(M, N, K, alpha, beta, C, ldc)) return;
  thread_local std::vector<uint16_t> abuf, bbuf;
  // Stored shapes: A is [M,K] (N) or [K,M] (T); B is [K,N] (N) or [N,K] (T).
  const int64_t ar = ta == Trans::N ? M : K, ac = ta == Trans::N ? K : M;
  const int64_t br = tb == Trans::N ? K : N, bc = tb == Trans::N ? N : K;
  const uint16_t* a16 = to_bf16(A, ar, ac, lda, abuf);
  Bf16Weights* held = g_held.load(std::memory_order_acquire);
  const uint16_t* b16 = held != nullptr ? held->find(B, (br - 1) * ldb + bc) : nullptr;
  if (b16 == nullptr) {
    b16 = to_bf16(B, br, bc, ldb, bbuf);
    ldb = bc;
  }
  onednn::matmul_bf16(ta, tb, M, N, K, alpha, a16, ac, b16, ldb, beta, C, ldc);
}
}  // namespace

struct Bf16Weights::State {
  struct Weight {
    const float* w = nullptr;
    int64_t n = 0;
    uint16_t* copy = nullptr;
    std::atomic<bool> rounded{false};
    std::mutex mu;  // held by the thread that rounds it
  };
  struct Group {
    std::unique_ptr<uint16_t[]> data;  // default-initialised: a page is touched when its weight is rounded
    size_t size = 0;
    std::vector<std::unique_ptr<Weight>> held;  // empty: released
  };
  std::map<int, Group> groups;
  std::map<const float*, Weight*, std::less<>> index;  // by first element
};

Bf16Weights::Bf16Weights() : s_(std::make_unique<State>()) {}
Bf16Weights::~Bf16Weights() = default;

void Bf16Weights::hold(int group, const std::vector<std::pair<const float*, int64_t>>& weights) {
  release(group, true);
  State::Group& g = s_->groups[group];
  size_t total = 0;
  for (const auto& [w, n] : weights) {
    OLMO_CHECK(n >= 0 && (n == 0 || w != nullptr), "Bf16Weights: weight with n=", n, " has no data");
    total += size_t(n);
  }
  if (g.size < total) {
    g.data.reset(new uint16_t[total]);
    g.size = total;
  }
  size_t at = 0;
  for (const auto& [w, n] : weights) {
    if (n == 0) continue;
    auto x = std::make_unique<State::Weight>();
    x->w = w;
    x->n = n;
    x->copy = g.data.get() + at;
    at += size_t(n);
    s_->index[w] = x.get();
    g.held.push_back(std::move(x));
  }
}

bool Bf16Weights::holds(int group) const {
  auto it = s_->groups.find(group);
  return it != s_->groups.end() && !it->second.held.empty();
}

void Bf16Weights::release(int group, bool keep_memory) {
  auto it = s_->groups.find(group);
  if (it == s_->groups.end()) return;
  for (const auto& x : it->second.held) {
    auto at = s_->index.find(x->w);
    if (at != s_->index.end() && at->second == x.get()) s_->index.erase(at);
  }
  it->second.held.clear();
  if (!keep_memory) s_->groups.erase(it);
}

void Bf16Weights::release_all(bool keep_memory) {
  std::vector<int> ids;
  for (const auto& [id, g] : s_->groups) ids.push_back(id);
  for (int id : ids) release(id, keep_memory);
}

const uint16_t* Bf16Weights::find(const float* w, int64_t extent) {
  // The held weight that starts at or before w (std::less orders unrelated pointers too).
  auto it = s_->index.upper_bound(w);
  if (it == s_->index.begin()) return nullptr;
  State::Weight& x = *std::prev(it)->second;
  const int64_t off = w - x.w;
  if (off + extent > x.n) return nullptr;
  if (!x.rounded.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(x.mu);
    if (!x.rounded.load(std::memory_order_relaxed)) {
      f32_to_bf16(x.w, x.copy, size_t(x.n));  // threaded when large and not inside a parallel region
      x.rounded.store(true, std::memory_order_release);
    }
  }
  return x.copy + off;
}

size_t Bf16Weights::bytes() const {
  size_t b = 0;
  for (const auto& [id, g] : s_->groups) b += g.size * sizeof(uint16_t);
  return b;
}

ScopedBf16Weights::ScopedBf16Weights(Bf16Weights* w) : prev_(g_held.exchange(w)) {}
ScopedBf16Weights::~ScopedBf16Weights() { g_held.store(prev_); }

void set_cpu_gemm(const CpuGemm& g) {
  if (g.compute == ComputeDtype::BF16) {
    std::string why;
    OLMO_CHECK(onednn::bf16_supported(&why), "bf16 compute needs oneDNN's bf16 matmul: ", why);
  }
  g_fp32_lib.store(g.fp32);
  g_compute.store(g.compute);
}

bool onednn_bf16_supported(std::string* why) { return onednn::bf16_supported(why); }

CpuGemm cpu_gemm() { return {g_fp32_lib.load(), g_compute.load()}; }

template <typename T>
void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc) {
  check_gemm_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  gemm_unchecked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void gemm_strided_batched(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                          int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta,
                          T* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  OLMO_CHECK(batch >= 0, "gemm_strided_batched: negative batch ", batch);
  check_gemm_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  OLMO_CHECK(stride_a >= 0 && stride_b >= 0, "gemm_strided_batched: negative stride (a=", stride_a,
             " b=", stride_b, ")");
  if (batch > 1 && M > 0 && N > 0)
    OLMO_CHECK(stride_c >= (M - 1) * ldc + N, "gemm_strided_batched: stride_c=", stride_c,
               " makes output batches overlap (needs >= ", (M - 1) * ldc + N, ")");
  for (int64_t b = 0; b < batch; ++b)
    gemm_unchecked(ta, tb, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta,
                   C + b * stride_c, ldc);
}

template <typename T>
void gemm_compute(Precision p, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  check_gemm_args(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if constexpr (std::is_same_v<T, float>) {
    if (p == Precision::Compute && g_compute.load(std::memory_order_relaxed) == ComputeDtype::BF16)
      return gemm_bf16_unchecked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  gemm_unchecked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template void gemm_compute<float>(Precision, Trans, Trans, int64_t, int64_t, int64_t, float, const float*,
                                  int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm_compute<double>(Precision, Trans, Trans, int64_t, int64_t, int64_t, double, const double*,
                                   int64_t, const double*, int64_t, double, double*, int64_t);
template void gemm<float>(Trans, Trans, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                          int64_t, float, float*, int64_t);
template void gemm<double>(Trans, Trans, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);
template void gemm_strided_batched<float>(Trans, Trans, int64_t, int64_t, int64_t, float, const float*,
                                          int64_t, int64_t, const float*, int64_t, int64_t, float, float*,
                                          int64_t, int64_t, int64_t);
template void gemm_strided_batched<double>(Trans, Trans, int64_t, int64_t, int64_t, double, const double*,
                                           int64_t, int64_t, const double*, int64_t, int64_t, double, double*,
                                           int64_t, int64_t, int64_t);

namespace {
void check_matrix(const Tensor& t, const char* name, DType dt) {
  OLMO_CHECK(t.defined(), "gemm: ", name, " is undefined");
  OLMO_CHECK(t.ndim() == 2, "gemm: ", name, " must be 2-D, got shape ", shape_str(t.shape()));
  OLMO_CHECK(t.dtype() == dt, "gemm: ", name, " is ", dtype_name(t.dtype()), ", expected ", dtype_name(dt));
  OLMO_CHECK(t.strides()[1] == 1 || t.size(1) <= 1, "gemm: ", name, " must have unit stride in its last dim");
}
int64_t ld_of(const Tensor& t) { return std::max<int64_t>({t.strides()[0], t.size(1), 1}); }
}  // namespace

void gemm(Trans ta, Trans tb, float alpha, const Tensor& A, const Tensor& B, float beta, Tensor& C) {
  OLMO_CHECK(C.defined(), "gemm: C is undefined");
  const DType dt = C.dtype();
  OLMO_CHECK(dt == DType::F32 || dt == DType::F64, "gemm: only F32/F64 tensors, got ", dtype_name(dt));
  check_matrix(A, "A", dt);
  check_matrix(B, "B", dt);
  check_matrix(C, "C", dt);
  const int64_t M = ta == Trans::N ? A.size(0) : A.size(1), K = ta == Trans::N ? A.size(1) : A.size(0);
  const int64_t Kb = tb == Trans::N ? B.size(0) : B.size(1), N = tb == Trans::N ? B.size(1) : B.size(0);
  OLMO_CHECK(K == Kb, "gemm: inner dimensions differ: op(A) is [", M, ",", K, "], op(B) is [", Kb, ",", N,
             "]");
  OLMO_CHECK(C.size(0) == M && C.size(1) == N, "gemm: C has shape ", shape_str(C.shape()), ", expected [", M,
             ", ", N, "]");
  if (dt == DType::F32)
    gemm<float>(ta, tb, M, N, K, alpha, A.data<float>(), ld_of(A), B.data<float>(), ld_of(B), beta,
                C.data<float>(), ld_of(C));
  else
    gemm<double>(ta, tb, M, N, K, alpha, A.data<double>(), ld_of(A), B.data<double>(), ld_of(B), beta,
                 C.data<double>(), ld_of(C));
}

template <typename T>
void linear_forward(const T* x, const T* W, T* y, int64_t N, int64_t in, int64_t out, Precision p) {
  gemm_compute<T>(p, Trans::N, Trans::T, N, out, in, T(1), x, in, W, in, T(0), y, out);
}

template <typename T>
void linear_backward(const T* dy, const T* x, const T* W, T* dx, T* dW, int64_t N, int64_t in, int64_t out,
                     bool accumulate_dx, Precision p) {
  if (dx)
    gemm_compute<T>(p, Trans::N, Trans::N, N, in, out, T(1), dy, out, W, in, accumulate_dx ? T(1) : T(0), dx,
                    in);
  if (dW) gemm_compute<T>(p, Trans::T, Trans::N, out, in, N, T(1), dy, out, x, in, T(1), dW, in);
}

template void linear_forward<float>(const float*, const float*, float*, int64_t, int64_t, int64_t, Precision);
template void linear_forward<double>(const double*, const double*, double*, int64_t, int64_t, int64_t,
                                     Precision);
template void linear_backward<float>(const float*, const float*, const float*, float*, float*, int64_t,
                                     int64_t, int64_t, bool, Precision);
template void linear_backward<double>(const double*, const double*, const double*, double*, double*, int64_t,
                                      int64_t, int64_t, bool, Precision);

namespace {
struct LinearDims {
  int64_t N, in, out;
};
LinearDims linear_dims(const Tensor& x, const Tensor& W, const char* who) {
  OLMO_CHECK(x.defined() && W.defined(), who, ": x or W is undefined");
  OLMO_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::F64, who, ": x must be F32/F64, got ",
             dtype_name(x.dtype()));
  OLMO_CHECK(W.dtype() == x.dtype(), who, ": W is ", dtype_name(W.dtype()), " but x is ",
             dtype_name(x.dtype()));
  OLMO_CHECK(x.ndim() >= 1 && x.is_contiguous(), who, ": x must be contiguous with >= 1 dim, got ",
             shape_str(x.shape()));
  OLMO_CHECK(W.ndim() == 2 && W.is_contiguous(), who, ": W must be a contiguous [out, in] matrix, got ",
             shape_str(W.shape()));
  const int64_t in = W.size(1), out = W.size(0);
  OLMO_CHECK(x.size(-1) == in, who, ": x's last dim ", x.size(-1), " != W's in-features ", in, " (W is ",
             shape_str(W.shape()), ")");
  return {x.numel() / std::max<int64_t>(1, in), in, out};
}
Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r.back() = last;
  return r;
}
void check_like(const Tensor& t, const Shape& shape, DType dt, const char* who, const char* name) {
  OLMO_CHECK(t.defined(), who, ": ", name, " is undefined");
  OLMO_CHECK(t.dtype() == dt && t.is_contiguous(), who, ": ", name, " must be contiguous ", dtype_name(dt));
  OLMO_CHECK(t.shape() == shape, who, ": ", name, " has shape ", shape_str(t.shape()), ", expected ",
             shape_str(shape));
}
}  // namespace

void linear_forward(const Tensor& x, const Tensor& W, Tensor& y) {
  auto d = linear_dims(x, W, "linear_forward");
  check_like(y, with_last(x.shape(), d.out), x.dtype(), "linear_forward", "y");
  if (x.dtype() == DType::F32)
    linear_forward<float>(x.data<float>(), W.data<float>(), y.data<float>(), d.N, d.in, d.out);
  else
    linear_forward<double>(x.data<double>(), W.data<double>(), y.data<double>(), d.N, d.in, d.out);
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& W, Tensor& dx, Tensor& dW,
                     bool accumulate_dx) {
  auto d = linear_dims(x, W, "linear_backward");
  check_like(dy, with_last(x.shape(), d.out), x.dtype(), "linear_backward", "dy");
  if (dx.defined()) check_like(dx, x.shape(), x.dtype(), "linear_backward", "dx");
  if (dW.defined()) check_like(dW, W.shape(), x.dtype(), "linear_backward", "dW");
  if (x.dtype() == DType::F32)
    linear_backward<float>(dy.data<float>(), x.data<float>(), W.data<float>(),
                           dx.defined() ? dx.data<float>() : nullptr,
                           dW.defined() ? dW.data<float>() : nullptr, d.N, d.in, d.out, accumulate_dx);
  else
    linear_backward<double>(dy.data<double>(), x.data<double>(), W.data<double>(),
                            dx.defined() ? dx.data<double>() : nullptr,
                            dW.defined() ? dW.data<double>() : nullptr, d.N, d.in, d.out, accumulate_dx);
}

GemmFlopCounter::GemmFlopCounter() {
  bool expected = false;
  OLMO_CHECK(g_count_flops.compare_exchange_strong(expected, true), "GemmFlopCounter: one is already active");
  g_flops.store(0);
}
GemmFlopCounter::~GemmFlopCounter() { g_count_flops.store(false); }
uint64_t GemmFlopCounter::flops() const { return g_flops.load(); }

std::string blas_description() {
  std::string cfg = openblas_get_config(), core = openblas_get_corename();
  while (!cfg.empty() && cfg.back() == ' ') cfg.pop_back();
  return cfg + " core=" + core;
}

std::string gemm_description() {
  const CpuGemm g = cpu_gemm();
  return std::string("fp32=") + gemm_lib_name(g.fp32) + " compute=" + compute_dtype_name(g.compute) +
         " (auto: " + gemm_lib_name(auto_gemm_lib()) + "); " + blas_description() + "; " +
         onednn::description();
}

std::string blas_core_hint() {
  const std::string core = openblas_get_corename();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (avx512 && (core == "Haswell" || core == "Zen" || core == "Sandybridge"))
    return "CPU has AVX-512 but OpenBLAS uses its " + core +
           " (AVX2) kernels; OPENBLAS_CORETYPE=SkylakeX in the environment selects the AVX-512 ones (about "
           "1.9x "
           "sgemm on Zen 5, bench/RESULTS.md)";
  return "";
}

}  // namespace olmosft
