// oneDNN matmul behind olmosft::gemm (kernels/gemm.h is the interface; only gemm.cpp and its tests include
// this). Debian 12's libdnnl 2.6 (GNU OpenMP, the same runtime as ours); the 3.x API (Ubuntu 24.04, the
// container image's build stage) is compiled where DNNL_VERSION_MAJOR >= 3 (scripts/check-onednn3.sh runs it
// against PyPI's oneDNN 3.2 build). One primitive per (operand dtype,
// transposes, beta), created once with every size and leading dimension a run-time value, so a GEMM of any
// shape (the MoE experts' token counts change every step) reuses it: oneDNN then runs its "gemm:jit"
// kernels, which measured as fast as shape-specialised primitives on this machine (bench/RESULTS.md).
#pragma once
#include <cstdint>
#include <string>

#include "kernels/gemm.h"

namespace olmosft::onednn {

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major, C fp32. Arguments are checked by the caller
// (gemm.cpp); M, N, K > 0 and alpha != 0 here. Results depend only on the operands, the shapes and the
// OpenMP thread count (tested: repeatable bit for bit).
void matmul_f32(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// The same with bf16 operands (raw bits, as core/bf16.h makes them), products accumulated in fp32.
void matmul_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// "oneDNN 2.6.3 (f32: gemm:jit, bf16: gemm:jit)", or why a kind cannot run here (no primitive for it).
std::string description();
// Whether this CPU has AVX512-BF16 and oneDNN a bf16 matmul primitive for it; `why` says otherwise.
bool bf16_supported(std::string* why);

}  // namespace olmosft::onednn
