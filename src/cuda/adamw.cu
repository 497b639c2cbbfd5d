#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/adamw.h"
#include "cuda/device_util.cuh"

namespace olmosft::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void sumsq_kernel(const AdamWTensor* ts, const int32_t* chunk_tensor, const int64_t* chunk_offset,
                             int64_t chunk, double* partial) {
  __shared__ double smem[32];
  const int64_t c = blockIdx.x;
  const AdamWTensor t = ts[chunk_tensor[c]];
  const int64_t b = chunk_offset[c], e = min(t.n, b + chunk);
  double s = 0;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) s += double(t.g[i]) * double(t.g[i]);
  s = dev::block_sum(s, smem);
  if (threadIdx.x == 0) partial[c] = s;
}

__global__ void norm_kernel(const double* partial, int64_t n, double* norm) {
  __shared__ double smem[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = dev::block_sum(s, smem);
  if (threadIdx.x == 0) norm[0] = sqrt(s);
}

__global__ void clip_kernel(const AdamWTensor* ts, const int32_t* chunk_tensor, const int64_t* chunk_offset,
                            int64_t chunk, const double* norm, double max_norm) {
  const double coef = fmin(1.0, max_norm / (norm[0] + 1e-6));
  if (!(coef < 1.0)) return;
  const float cf = float(coef);
  const int64_t c = blockIdx.x;
  const AdamWTensor t = ts[chunk_tensor[c]];
  const int64_t b = chunk_offset[c], e = min(t.n, b + chunk);
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) t.g[i] = __fmul_rn(t.g[i], cf);
}

struct StepConsts {
  float step_size, bc2_sqrt, eps, b1, b2, omb1, omb2, keep_decay, keep_plain;
};

__global__ void adamw_kernel(const AdamWTensor* ts, const int32_t* chunk_tensor, const int64_t* chunk_offset,
                             int64_t chunk, StepConsts k) {
  const int64_t c = blockIdx.x;
  const AdamWTensor t = ts[chunk_tensor[c]];
  const int64_t b = chunk_offset[c], e = min(t.n, b + chunk);
  const float keep = t.decay ? k.keep_decay : k.keep_plain;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    const float gi = t.g[i];
    float pi = __fmul_rn(t.p[i], keep);
    const float mi = __fadd_rn(__fmul_rn(t.m[i], k.b1), __fmul_rn(gi, k.omb1));
    const float vi = __fadd_rn(__fmul_rn(t.v[i], k.b2), __fmul_rn(__fmul_rn(gi, gi), k.omb2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
    pi = __fadd_rn(pi, __fmul_rn(-k.step_size, __fdiv_rn(mi, denom)));
    t.p[i] = pi;
    t.m[i] = mi;
    t.v[i] = vi;
    if (t.p_bf16) t.p_bf16[i] = dev::to_bf16(pi);
  }
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

}  // namespace

MultiTensorAdamW::MultiTensorAdamW(const std::vector<AdamWTensor>& tensors) : tensors_(tensors) {
  std::vector<int32_t> ct;
  std::vector<int64_t> co;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const AdamWTensor& t = tensors[k];
    require(t.n >= 0 && (t.n == 0 || (t.p && t.g && t.m && t.v)),
            "MultiTensorAdamW: tensor " + std::to_string(k) + " (n=" + std::to_string(t.n) +
                ") is missing p, g, m or v");
    for (int64_t o = 0; o < t.n; o += kChunk) {
      ct.push_back(int32_t(k));
      co.push_back(o);
    }
  }
  require(ct.size() < (size_t(1) << 31), "MultiTensorAdamW: too many chunks");
  nchunks_ = int64_t(ct.size());
  dtensors_ = DeviceArray<AdamWTensor>(tensors);
  chunk_tensor_ = DeviceArray<int32_t>(ct);
  chunk_offset_ = DeviceArray<int64_t>(co);
  partial_ = DeviceArray<double>(size_t(std::max<int64_t>(1, nchunks_)));
  norm_ = DeviceArray<double>(1);
}

double MultiTensorAdamW::clip_grad_norm(double max_norm, cudaStream_t stream) {
  if (nchunks_ == 0) return 0.0;
  sumsq_kernel<<<unsigned(nchunks_), kThreads, 0, stream>>>(dtensors_.data(), chunk_tensor_.data(),
                                                            chunk_offset_.data(), kChunk, partial_.data());
  check(cudaGetLastError(), "clip_grad_norm (sum of squares)");
  norm_kernel<<<1, 1024, 0, stream>>>(partial_.data(), nchunks_, norm_.data());
  check(cudaGetLastError(), "clip_grad_norm (norm)");
  double norm = 0;
  check(cudaMemcpyAsync(&norm, norm_.data(), sizeof(norm), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "clip_grad_norm");
  if (!std::isfinite(norm))
    throw std::runtime_error("clip_grad_norm: the global gradient norm is not finite (" +
                             std::to_string(norm) + "); a gradient contains NaN or inf");
  if (max_norm > 0) {
    clip_kernel<<<unsigned(nchunks_), kThreads, 0, stream>>>(
        dtensors_.data(), chunk_tensor_.data(), chunk_offset_.data(), kChunk, norm_.data(), max_norm);
    check(cudaGetLastError(), "clip_grad_norm (scale)");
  }
  return norm;
}

void MultiTensorAdamW::step(const AdamWConfig& cfg, int64_t step, cudaStream_t stream) {
  require(std::isfinite(cfg.lr) && cfg.lr >= 0, "adamw: lr must be finite and >= 0");
  require(cfg.beta1 >= 0 && cfg.beta1 < 1 && cfg.beta2 >= 0 && cfg.beta2 < 1,
          "adamw: betas must be in [0, 1)");
  require(std::isfinite(cfg.eps) && cfg.eps >= 0, "adamw: eps must be finite and >= 0");
  require(std::isfinite(cfg.weight_decay) && cfg.weight_decay >= 0,
          "adamw: weight_decay must be finite and >= 0");
  require(step >= 1, "adamw: step must be >= 1 (1-based), got " + std::to_string(step));
  if (nchunks_ == 0) return;
  // The CPU kernel's constants, computed the same way (double, then rounded to float).
  const double bc1 = 1.0 - std::pow(cfg.beta1, double(step)), bc2 = 1.0 - std::pow(cfg.beta2, double(step));
  StepConsts k{float(cfg.lr / bc1),
               float(std::sqrt(bc2)),
               float(cfg.eps),
               float(cfg.beta1),
               float(cfg.beta2),
               float(1.0 - cfg.beta1),
               float(1.0 - cfg.beta2),
               float(1.0 - cfg.lr * cfg.weight_decay),
               1.0f};
  adamw_kernel<<<unsigned(nchunks_), kThreads, 0, stream>>>(dtensors_.data(), chunk_tensor_.data(),
                                                            chunk_offset_.data(), kChunk, k);
  check(cudaGetLastError(), "adamw_step");
}

}  // namespace olmosft::cuda
