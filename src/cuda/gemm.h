// GEMM through cuBLASLt (issue 15 item 2): bf16 A and B, fp32 accumulation (CUBLAS_COMPUTE_32F), bf16 or fp32
// C, row-major like src/kernels/gemm.h. One Gemm holds the cuBLASLt handle and one cudaMalloc'ed workspace
// (no managed memory), and caches the algorithm chosen per problem (shape, transposes, leading dimensions,
// output type, operand alignment), so a repeated call runs the same kernel: results are bitwise reproducible
// run to run on one GPU and cuBLAS version (cuBLASLt's split-K reductions are in-place or through the
// workspace in a fixed order, never atomics).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace olmosft::cuda {

enum class Op { N, T };
enum class OutType { BF16, F32 };

class Gemm {
 public:
  // 32 MiB: what cuBLASLt's Hopper kernels may ask for (llm.c uses the same).
  explicit Gemm(size_t workspace_bytes = size_t{32} << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Row-major C[M, N] = alpha * op(A) op(B) + beta * C, all pointers in device memory.
  //   op(A) is [M, K]: A is [M, K] with row stride lda >= K (Op::N), or [K, M] with lda >= M (Op::T).
  //   op(B) is [K, N]: B is [K, N] with ldb >= N (Op::N), or [N, K] with ldb >= K (Op::T).
  // So the model's y = x W^T (nn.Linear, W [out, in]) is matmul(N, T, ...), dx = dy W is (N, N) and
  // dW += dy^T x is (T, N) with beta = 1 and an fp32 C. A, B: bf16 bit patterns; C: uint16_t* (BF16) or
  // float* (F32), ldc >= N. beta = 0 never reads C. Throws std::invalid_argument on bad sizes and
  // std::runtime_error naming the cuBLASLt call that failed (e.g. no algorithm for this problem).
  void matmul(Op opA, Op opB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
              const uint16_t* B, int64_t ldb, float beta, void* C, OutType ct, int64_t ldc,
              cudaStream_t stream = nullptr);

  size_t cached_algorithms() const { return algos_.size(); }

 private:
  struct Algo;
  // (opA, opB, M, N, K, lda, ldb, ldc, ct, alignment of A, B, C in bytes)
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int>;
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::shared_ptr<Algo>> algos_;
};

// Version of the cuBLASLt library loaded at run time (cublasLtGetVersion), for logs.
size_t cublaslt_version();

}  // namespace olmosft::cuda
