// GEMM: thin, validated wrappers over OpenBLAS cblas_sgemm / cblas_dgemm or oneDNN's matmul (row-major), a
// strided batched GEMM, and the nn.Linear forward/backward (y = x W^T with W stored [out, in]).
//
// Every entry point checks its sizes and leading dimensions before calling BLAS (a wrong ld is the
// classic silent-corruption bug) and throws olmosft::Error naming the argument. Templates are
// instantiated for float and double so that gradient checks run in float64 through the same code.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace olmosft {

enum class Trans { N, T };

// The CPU GEMM set-up of a run: process-wide, set once by whoever starts the work (the trainer from the
// recipe's compute.gemm / compute.dtype keys; docs/train.md "CPU GEMMs").
//   fp32: the library of every float GEMM through this header. OpenBLAS (Debian's) or oneDNN (Debian's
//         libdnnl, its run-time-shape "gemm:jit" kernels). float64 always runs on OpenBLAS.
//   compute: the operands of the layers' weight GEMMs (linear_*, the LM head: Precision::Compute). BF16
//         rounds both operands to bf16 (nearest-even) and accumulates the products in fp32 through oneDNN
//         (AVX512-BF16 dot products); results, master weights and optimizer state stay fp32.
// Both are deterministic for a given thread count.
enum class GemmLib { OpenBLAS, OneDNN };
enum class ComputeDtype { F32, BF16 };
struct CpuGemm {
  GemmLib fp32 = GemmLib::OpenBLAS;
  ComputeDtype compute = ComputeDtype::F32;
};
// Throws olmosft::Error when the CPU cannot run it (bf16 needs oneDNN's AVX-512 kernels).
void set_cpu_gemm(const CpuGemm& g);
CpuGemm cpu_gemm();
// Sets a CpuGemm for its lifetime (tests, benchmarks), restoring the previous one.
class ScopedCpuGemm {
 public:
  explicit ScopedCpuGemm(const CpuGemm& g) : prev_(cpu_gemm()) { set_cpu_gemm(g); }
  ~ScopedCpuGemm() { set_cpu_gemm(prev_); }
  ScopedCpuGemm(const ScopedCpuGemm&) = delete;
  ScopedCpuGemm& operator=(const ScopedCpuGemm&) = delete;

 private:
  CpuGemm prev_;
};
// "auto" resolves to this machine's choice (measured with bench_gemm and bench_train, bench/RESULTS.md "CPU
// GEMM library and bf16 compute"): oneDNN on a CPU with AVX-512, where its kernels share our OpenMP thread
// pool (OpenBLAS's own pthread pool spins after each call while our loops run) and training steps measured
// 1.0-1.5x faster; OpenBLAS elsewhere (not measured). Both are deterministic for a given thread count.
GemmLib auto_gemm_lib();
// Whether this CPU can run ComputeDtype::BF16 (oneDNN's bf16 matmul); `why` says why not.
bool onednn_bf16_supported(std::string* why);
// Parse "auto" | "openblas" | "onednn" and "fp32" | "bf16"; `where` names the key in errors.
GemmLib parse_gemm_lib(const std::string& text, const std::string& where);
ComputeDtype parse_compute_dtype(const std::string& text, const std::string& where);
const char* gemm_lib_name(GemmLib l);
const char* compute_dtype_name(ComputeDtype d);

// The precision of one weight GEMM: Compute follows cpu_gemm().compute; Exact keeps the operands' own
// (the MoE router, whose top-k choice must not flip on rounding). double is always exact.
enum class Precision { Compute, Exact };

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, all row-major.
// op(A) = A (A stored [M,K], lda >= K) or A^T (A stored [K,M], lda >= M); likewise for B.
// With beta == 0, C is overwritten (NaNs in C do not propagate, as in BLAS).
template <typename T>
void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc);

// Strided batched GEMM: for b in [0, batch): C_b = alpha op(A_b) op(B_b) + beta C_b with
// X_b = X + b * stride_x. A stride of 0 broadcasts that operand. C batches must not overlap.
template <typename T>
void gemm_strided_batched(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                          int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta,
                          T* C, int64_t ldc, int64_t stride_c, int64_t batch);

// gemm() in `p`'s precision: for float under ComputeDtype::BF16 and Precision::Compute, both operands are
// rounded to bf16 and the products summed in fp32 (into fp32 C); otherwise exactly gemm().
template <typename T>
void gemm_compute(Precision p, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// bf16 copies of weights, for gemm_compute under ComputeDtype::BF16: a GEMM whose B operand lies in a held
// weight reads its copy instead of rounding B again at that call. The same rounding of the same values, so
// the same result; once per hold instead of once per GEMM (a hybrid training step rounded about 290M
// elements, most of them routed-expert weights rounded three times: forward, recomputation, dx). A weight is
// rounded when a GEMM first reads it (so matrices no GEMM reads, as an untied embedding, cost nothing); that
// GEMM's thread rounds it, the others wait for it. The holder promises that a held weight's values do not
// change until it is released. One holder is in use at a time (ScopedBf16Weights); hold and release run
// between GEMMs, never inside a parallel region that runs them.
class Bf16Weights {
 public:
  Bf16Weights();
  ~Bf16Weights();
  Bf16Weights(const Bf16Weights&) = delete;
  Bf16Weights& operator=(const Bf16Weights&) = delete;
  // Holds `weights` (pointer, element count) under `group`, replacing what the group held.
  void hold(int group, const std::vector<std::pair<const float*, int64_t>>& weights);
  bool holds(int group) const;
  // Forgets a group's copies; keep_memory: their buffer stays allocated for the group's next hold.
  void release(int group, bool keep_memory);
  void release_all(bool keep_memory);
  // The copy of [w, w + extent) when that lies inside one held weight (a slice of it too: the LM head's
  // vocabulary tiles), rounded now if no GEMM read it yet; else nullptr. Safe from several threads.
  const uint16_t* find(const float* w, int64_t extent);
  size_t bytes() const;  // allocated for copies (pages no GEMM read are never touched)

 private:
  struct State;
  std::unique_ptr<State> s_;
};
// Makes `w` the holder that gemm_compute reads for its lifetime (nullptr: none), restoring the previous one.
class ScopedBf16Weights {
 public:
  explicit ScopedBf16Weights(Bf16Weights* w);
  ~ScopedBf16Weights();
  ScopedBf16Weights(const ScopedBf16Weights&) = delete;
  ScopedBf16Weights& operator=(const ScopedBf16Weights&) = delete;

 private:
  Bf16Weights* prev_;
};

// Tensor overload: 2-D F32 or F64 tensors whose last dim has stride 1 (row views and slices are fine).
// op(A) is A or A^T by `ta`; shapes are checked against C.
void gemm(Trans ta, Trans tb, float alpha, const Tensor& A, const Tensor& B, float beta, Tensor& C);

// nn.Linear without bias. x [N, in], W [out, in], y [N, out]: y = x W^T (overwrites y). Its GEMMs (and
// linear_backward's) run in `p`'s precision (gemm_compute).
template <typename T>
void linear_forward(const T* x, const T* W, T* y, int64_t N, int64_t in, int64_t out,
                    Precision p = Precision::Compute);

// Backward of linear_forward given dy [N, out]:
//   dx = dy W        (overwritten; or accumulated when accumulate_dx; skipped when dx == nullptr)
//   dW += dy^T x     (always accumulated, as gradients over micro-batches are; skipped when dW == nullptr)
template <typename T>
void linear_backward(const T* dy, const T* x, const T* W, T* dx, T* dW, int64_t N, int64_t in, int64_t out,
                     bool accumulate_dx = false, Precision p = Precision::Compute);

// Tensor overloads (F32 or F64, contiguous): x [N, in] (or [..., in], flattened), W [out, in], y [..., out].
void linear_forward(const Tensor& x, const Tensor& W, Tensor& y);
// dx may be an undefined Tensor to skip it; dW is accumulated.
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& W, Tensor& dx, Tensor& dW,
                     bool accumulate_dx = false);

// Test-only FLOP counter. While a GemmFlopCounter is alive, every GEMM that reaches BLAS through this
// header (gemm, gemm_strided_batched, linear_*, from any thread) adds 2*M*N*K to it. Off, the cost is one
// relaxed atomic load per call; results never change. One counter at a time (a second one throws).
// Not counted: attention's tile products and KDA's triangular solves, which call cblas directly.
class GemmFlopCounter {
 public:
  GemmFlopCounter();
  ~GemmFlopCounter();
  GemmFlopCounter(const GemmFlopCounter&) = delete;
  GemmFlopCounter& operator=(const GemmFlopCounter&) = delete;
  uint64_t flops() const;  // counted since construction
};

// The GEMM set-up in use, for selfcheck and run logs: "fp32=openblas compute=fp32; OpenBLAS ...; oneDNN ...".
std::string gemm_description();

// The BLAS in use, e.g. "OpenBLAS 0.3.21 ... core=Haswell", plus a hint when the CPU has AVX-512 but
// OpenBLAS picked an AVX2 core (OpenBLAS 0.3.21 does not know AMD family 26; OPENBLAS_CORETYPE=SkylakeX
// set before the process starts selects its AVX-512 kernels, see bench/RESULTS.md). Empty hint otherwise.
std::string blas_description();
std::string blas_core_hint();

}  // namespace olmosft
