#include <cublasLt.h>

#include <stdexcept>
#include <string>

#include "cuda/check.h"
#include "cuda/gemm.h"

namespace olmosft::cuda {
namespace {

void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLASLt status " + std::to_string(int(s)));
}

// Largest power of two (<= 256) dividing the address: cuBLASLt's kernels assume 256-byte aligned operands
// unless told otherwise (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*), and a slice (a vocabulary chunk of the LM
// head) may be less aligned.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % uintptr_t(al)) != 0) al >>= 1;
  return al;
}

}  // namespace

// One cached problem: its descriptors and the algorithm cuBLASLt's heuristic picked once.
struct Gemm::Algo {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Algo() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Gemm::Gemm(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  cublasLtHandle_t h = nullptr;
  lt_check(cublasLtCreate(&h), "cublasLtCreate");
  handle_ = h;
  if (workspace_bytes_) {
    const cudaError_t e = cudaMalloc(&workspace_, workspace_bytes_);
    if (e != cudaSuccess) {
      cublasLtDestroy(h);
      check(e, "cudaMalloc (cuBLASLt workspace)");
    }
  }
}

Gemm::~Gemm() {
  algos_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

void Gemm::matmul(Op opA, Op opB, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                  int64_t lda, const uint16_t* B, int64_t ldb, float beta, void* C, OutType ct, int64_t ldc,
                  cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0) throw std::invalid_argument("Gemm::matmul: negative size");
  if (lda < (opA == Op::N ? K : M) || ldb < (opB == Op::N ? N : K) || ldc < N || lda < 1 || ldb < 1 ||
      ldc < 1)
    throw std::invalid_argument(
        "Gemm::matmul: leading dimension smaller than the row length (M=" + std::to_string(M) +
        " N=" + std::to_string(N) + " K=" + std::to_string(K) + " lda=" + std::to_string(lda) +
        " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) + ")");
  if (M == 0 || N == 0) return;
  // Row-major C[M,N] is column-major C^T[N,M] (ld ldc), and C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B
  // and its "B" is our A, with the same transpose flags (a row-major matrix read column-major is its
  // transpose already).
  const Key key{int(opA),     int(opB),     M,           N, K, lda, ldb, ldc, int(ct),
                alignment(A), alignment(B), alignment(C)};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    auto al = std::make_shared<Algo>();
    const cudaDataType_t ctype = ct == OutType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    lt_check(cublasLtMatmulDescCreate(&al->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = opB == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t tb = opA == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T;
    lt_check(cublasLtMatmulDescSetAttribute(al->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(al->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB");
    // Stored shapes (column-major rows x cols) of cuBLASLt's A (our B) and B (our A).
    const uint64_t a_rows = uint64_t(opB == Op::N ? N : K), a_cols = uint64_t(opB == Op::N ? K : N);
    const uint64_t b_rows = uint64_t(opA == Op::N ? K : M), b_cols = uint64_t(opA == Op::N ? M : K);
    lt_check(cublasLtMatrixLayoutCreate(&al->a, CUDA_R_16BF, a_rows, a_cols, ldb), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&al->b, CUDA_R_16BF, b_rows, b_cols, lda), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&al->c, ctype, uint64_t(N), uint64_t(M), ldc), "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint32_t alB = uint32_t(std::get<9>(key)), alA = uint32_t(std::get<10>(key)),
                   alC = uint32_t(std::get<11>(key));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                         sizeof(workspace_bytes_));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &alA, sizeof(alA));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &alB, sizeof(alB));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &alC, sizeof(alC));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alC, sizeof(alC));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
        static_cast<cublasLtHandle_t>(handle_), al->op, al->a, al->b, al->c, al->c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    lt_check(s, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      throw std::runtime_error("cublasLtMatmulAlgoGetHeuristic: no algorithm for M=" + std::to_string(M) +
                               " N=" + std::to_string(N) + " K=" + std::to_string(K));
    al->algo = res.algo;
    it = algos_.emplace(key, std::move(al)).first;
  }
  const Algo& al = *it->second;
  lt_check(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), al.op, &alpha, B, al.a, A, al.b, &beta, C,
                          al.c, C, al.c, &al.algo, workspace_, workspace_bytes_, stream),
           "cublasLtMatmul");
}

size_t cublaslt_version() { return cublasLtGetVersion(); }

}  // namespace olmosft::cuda
