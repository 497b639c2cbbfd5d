#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda/smoke.h"

namespace olmosft::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                             ")");
  }
}

// Device buffer freed on scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { check(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

__global__ void bf16_fma_kernel(float a, const uint16_t* x, const uint16_t* y, uint16_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float xf = __bfloat162float(__ushort_as_bfloat16(x[i]));
    const float yf = __bfloat162float(__ushort_as_bfloat16(y[i]));
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmaf_rn(a, xf, yf)));
  }
}

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why)
      *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    cudaGetLastError();  // reset the runtime's last-error state
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

std::string describe_device(int dev) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  int runtime = 0, driver = 0;
  check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  return std::string(p.name) + ", compute capability " + std::to_string(p.major) + "." +
         std::to_string(p.minor) + ", " + std::to_string(p.multiProcessorCount) + " SMs, " +
         std::to_string(p.totalGlobalMem >> 20) + " MiB, runtime " + std::to_string(runtime) + ", driver " +
         std::to_string(driver);
}

std::vector<uint16_t> bf16_fma(float a, std::span<const uint16_t> x, std::span<const uint16_t> y) {
  if (x.size() != y.size()) throw std::invalid_argument("bf16_fma: x and y differ in size");
  const size_t n = x.size();
  std::vector<uint16_t> out(n);
  if (n == 0) return out;
  const size_t bytes = n * sizeof(uint16_t);
  DeviceBuffer dx(bytes), dy(bytes), dout(bytes);
  check(cudaMemcpy(dx.p, x.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy x");
  check(cudaMemcpy(dy.p, y.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy y");
  check(cudaMemset(dout.p, 0xff, bytes),
        "cudaMemset out");  // poison: 0xffff is a NaN the kernel never writes
  const unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + threads - 1) / threads, 4096));
  bf16_fma_kernel<<<blocks, threads>>>(a, static_cast<const uint16_t*>(dx.p),
                                       static_cast<const uint16_t*>(dy.p), static_cast<uint16_t*>(dout.p), n);
  check(cudaGetLastError(), "bf16_fma_kernel launch");
  check(cudaDeviceSynchronize(), "bf16_fma_kernel");
  check(cudaMemcpy(out.data(), dout.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy out");
  return out;
}

}  // namespace olmosft::cuda
