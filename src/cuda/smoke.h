// The CUDA smoke library (issue 13): the first code nvcc builds in olmosft. It proves the toolchain, the
// architecture flags and the runtime linkage; there is no CUDA training code yet (issue 15). Built only when
// CMake finds nvcc (cmake/cuda.cmake); this header is plain C++ and needs no CUDA headers.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace olmosft::cuda {

// Number of CUDA devices the runtime sees (cudaGetDeviceCount). 0 when there is none or no usable driver;
// then *why (if given) says what the runtime answered.
int device_count(std::string* why = nullptr);

// One line about device `dev`: name, compute capability, multiprocessors, memory.
std::string describe_device(int dev);

// out[i] = bf16(fma(a, x[i], y[i])) on the current device: bf16 inputs widened to fp32, one exactly rounded
// fp32 fused multiply-add, rounded to bf16 to nearest even, all with the device's own intrinsics
// (cuda_bf16.h), independent of the CPU's core/bf16.h. Throws std::runtime_error naming the failed CUDA call,
// std::invalid_argument on mismatched sizes.
std::vector<uint16_t> bf16_fma(float a, std::span<const uint16_t> x, std::span<const uint16_t> y);

}  // namespace olmosft::cuda
