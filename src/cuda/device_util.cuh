// Device-side helpers shared by the .cu files of the CUDA area: bf16 loads/stores and fixed-order block
// reductions. Every reduction here has one fixed shape (a per-thread strided loop, then a butterfly over the
// warp, then the warps' results summed in warp order by warp 0), so for a given blockDim the result is
// bitwise reproducible from run to run (no atomics, no order that depends on scheduling).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace olmosft::cuda::dev {

__device__ __forceinline__ float ld_bf16(const uint16_t* p, int64_t i) {
  return __bfloat162float(__ushort_as_bfloat16(p[i]));
}
__device__ __forceinline__ uint16_t to_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total. `smem`
// holds 32 values of T. Fixed order: xor butterfly within each warp, then warp 0 sums the warp totals.
template <typename T>
__device__ T block_sum(T v, T* smem) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, nwarps = int(blockDim.x) >> 5;
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T s = lane < nwarps ? smem[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) smem[0] = s;
  }
  __syncthreads();
  return smem[0];
}

// Maximum of v over the block, same shape as block_sum.
__device__ inline float block_max(float v, float* smem) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, nwarps = int(blockDim.x) >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < nwarps ? smem[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) smem[0] = s;
  }
  __syncthreads();
  return smem[0];
}

inline unsigned grid_for(int64_t n, unsigned threads, unsigned cap = 65535u * 8u) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > cap ? cap : b));
}

}  // namespace olmosft::cuda::dev
