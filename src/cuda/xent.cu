#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/device_util.cuh"
#include "cuda/xent.h"

namespace olmosft::cuda {
namespace {

using dev::to_bf16;

constexpr unsigned kThreads = 256;

__device__ __forceinline__ bool trained(const int32_t* targets, const uint8_t* mask, int64_t i,
                                        int32_t ignore, int64_t valid) {
  const int32_t t = targets[i];
  return (mask == nullptr || mask[i] != 0) && t != ignore && t >= 0 && t < valid;
}

// Per token of the row block: max and sum of exp(logit - max) over this chunk, and the target's logit when it
// falls in the chunk. One block per token.
__global__ void chunk_stats_kernel(const float* logits, int64_t nc, int64_t r0, int64_t c0, int64_t c,
                                   int64_t nchunks, const int32_t* targets, const uint8_t* mask,
                                   int32_t ignore, int64_t valid, float* part_max, float* part_sum,
                                   float* tgt_logit) {
  __shared__ float smem[32];
  const int64_t i = r0 + blockIdx.x;
  const float* l = logits + int64_t(blockIdx.x) * nc;
  if (!trained(targets, mask, i, ignore, valid)) {
    if (threadIdx.x == 0) part_max[i * nchunks + c] = -INFINITY, part_sum[i * nchunks + c] = 0.f;
    return;  // uniform over the block
  }
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < nc; j += blockDim.x) m = fmaxf(m, l[j]);
  m = dev::block_max(m, smem);
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < nc; j += blockDim.x) s += expf(l[j] - m);
  s = dev::block_sum(s, smem);
  if (threadIdx.x == 0) {
    part_max[i * nchunks + c] = m;
    part_sum[i * nchunks + c] = s;
    const int64_t t = targets[i];
    if (t >= c0 && t < c0 + nc) tgt_logit[i] = l[t - c0];
  }
}

// Per token (one thread each): combine the chunks in order (online logsumexp in double), lse, ce, z.
__global__ void finalize_kernel(const float* part_max, const float* part_sum, const float* tgt_logit,
                                const int32_t* targets, const uint8_t* mask, int32_t ignore, int64_t valid,
                                int64_t N, int64_t nchunks, float* lse, double* row_ce, double* row_z) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  if (!trained(targets, mask, i, ignore, valid)) {
    lse[i] = 0.f, row_ce[i] = 0.0, row_z[i] = 0.0;
    return;
  }
  double M = -INFINITY, S = 0.0;
  for (int64_t c = 0; c < nchunks; ++c) {
    const double pm = part_max[i * nchunks + c], ps = part_sum[i * nchunks + c];
    const double Mn = fmax(M, pm);
    S = S * exp(M - Mn) + ps * exp(pm - Mn);
    M = Mn;
  }
  const double L = M + log(S);
  lse[i] = float(L);
  row_ce[i] = L - double(tgt_logit[i]);
  row_z[i] = L * L;
}

// One block of 1024: ce_sum, z_sum (double, fixed tree) and the trained / bad-target counts.
__global__ void reduce_kernel(const double* row_ce, const double* row_z, const int32_t* targets,
                              const uint8_t* mask, int32_t ignore, int64_t valid, int64_t N, double* sums,
                              int64_t* counts) {
  __shared__ double smem[32];
  double ce = 0, z = 0, cnt = 0, bad = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    ce += row_ce[i];
    z += row_z[i];
    const int32_t t = targets[i];
    if ((mask == nullptr || mask[i] != 0) && t != ignore) (t >= 0 && t < valid) ? (cnt += 1) : (bad += 1);
  }
  ce = dev::block_sum(ce, smem);
  z = dev::block_sum(z, smem);
  cnt = dev::block_sum(cnt, smem);
  bad = dev::block_sum(bad, smem);
  if (threadIdx.x == 0) sums[0] = ce, sums[1] = z, counts[0] = int64_t(cnt), counts[1] = int64_t(bad);
}

// dlogit tile (bf16): scale * (exp(l - lse) * (1 + 2 z_loss lse) - [j == target]); 0 for untrained tokens.
__global__ void grad_tile_kernel(const float* logits, int64_t nc, int64_t r0, int64_t c0,
                                 const int32_t* targets, const uint8_t* mask, int32_t ignore, int64_t valid,
                                 const float* lse, float scale, float z_loss, uint16_t* dlogit) {
  const int64_t i = r0 + blockIdx.x;
  const float* l = logits + int64_t(blockIdx.x) * nc;
  uint16_t* g = dlogit + int64_t(blockIdx.x) * nc;
  if (!trained(targets, mask, i, ignore, valid)) {
    for (int64_t j = threadIdx.x; j < nc; j += blockDim.x) g[j] = 0;
    return;
  }
  const float L = lse[i], k = scale * (1.0f + 2.0f * z_loss * L);
  const int64_t t = int64_t(targets[i]) - c0;
  for (int64_t j = threadIdx.x; j < nc; j += blockDim.x) {
    float v = expf(l[j] - L) * k;
    if (j == t) v -= scale;
    g[j] = to_bf16(v);
  }
}

__global__ void to_bf16_kernel(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = to_bf16(src[i]);
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

}  // namespace

FusedXent::FusedXent(Gemm& gemm, int64_t max_tokens, int64_t d, int64_t V_rows, const XentConfig& cfg)
    : gemm_(gemm), max_tokens_(max_tokens), d_(d), V_rows_(V_rows), cfg_(cfg) {
  require(max_tokens >= 0 && d > 0 && V_rows > 0,
          "FusedXent: bad shape max_tokens=" + std::to_string(max_tokens) + " d=" + std::to_string(d) +
              " V_rows=" + std::to_string(V_rows));
  require(cfg.valid_vocab > 0 && cfg.valid_vocab <= V_rows,
          "FusedXent: valid_vocab=" + std::to_string(cfg.valid_vocab) +
              " must be in [1, V_rows=" + std::to_string(V_rows) + "]");
  require(cfg.vocab_chunk > 0 && cfg.row_block > 0, "FusedXent: vocab_chunk and row_block must be > 0");
  require(std::isfinite(float(cfg.z_loss)) && float(cfg.z_loss) >= 0,
          "FusedXent: z_loss must be finite and >= 0");
  chunk_ = std::min(cfg.vocab_chunk, cfg.valid_vocab);
  block_ = std::max<int64_t>(1, std::min(cfg.row_block, max_tokens));
  nchunks_ = (cfg.valid_vocab + chunk_ - 1) / chunk_;
  const size_t T = size_t(std::max<int64_t>(1, max_tokens));
  logits_ = DeviceArray<float>(size_t(block_ * chunk_));
  dlogit_ = DeviceArray<uint16_t>(size_t(block_ * chunk_));
  dh_acc_ = DeviceArray<float>(size_t(block_ * d));
  part_max_ = DeviceArray<float>(T * size_t(nchunks_));
  part_sum_ = DeviceArray<float>(T * size_t(nchunks_));
  tgt_logit_ = DeviceArray<float>(T);
  row_ce_ = DeviceArray<double>(T);
  row_z_ = DeviceArray<double>(T);
  sums_ = DeviceArray<double>(2);
  counts_ = DeviceArray<int64_t>(2);
}

size_t FusedXent::workspace_bytes() const {
  return logits_.size() * 4 + dlogit_.size() * 2 + dh_acc_.size() * 4 + part_max_.size() * 8 +
         tgt_logit_.size() * 4 + row_ce_.size() * 16 + 32;
}

XentStats FusedXent::forward(const uint16_t* h, const uint16_t* W, const int32_t* targets,
                             const uint8_t* mask, int64_t N, float* lse, cudaStream_t stream) {
  require(N >= 0 && N <= max_tokens_, "FusedXent::forward: N=" + std::to_string(N) +
                                          " outside [0, max_tokens=" + std::to_string(max_tokens_) + "]");
  XentStats st;
  if (N == 0) return st;
  const int64_t V = cfg_.valid_vocab;
  tiles(
      h, W, N, stream,
      [&](int64_t r0, int64_t nr, int64_t c, int64_t c0, int64_t nc) {
        chunk_stats_kernel<<<unsigned(nr), kThreads, 0, stream>>>(
            logits_.data(), nc, r0, c0, c, nchunks_, targets, mask, cfg_.ignore_index, V, part_max_.data(),
            part_sum_.data(), tgt_logit_.data());
        check(cudaGetLastError(), "FusedXent::forward (chunk stats)");
      },
      nullptr);
  finalize_kernel<<<dev::grid_for(N, kThreads), kThreads, 0, stream>>>(
      part_max_.data(), part_sum_.data(), tgt_logit_.data(), targets, mask, cfg_.ignore_index, V, N, nchunks_,
      lse, row_ce_.data(), row_z_.data());
  check(cudaGetLastError(), "FusedXent::forward (finalize)");
  reduce_kernel<<<1, 1024, 0, stream>>>(row_ce_.data(), row_z_.data(), targets, mask, cfg_.ignore_index, V, N,
                                        sums_.data(), counts_.data());
  check(cudaGetLastError(), "FusedXent::forward (reduce)");
  double sums[2];
  int64_t counts[2];
  check(cudaMemcpyAsync(sums, sums_.data(), sizeof(sums), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaMemcpyAsync(counts, counts_.data(), sizeof(counts), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "FusedXent::forward");
  require(counts[1] == 0, "FusedXent::forward: " + std::to_string(counts[1]) +
                              " trained token(s) have a target outside [0, valid_vocab=" + std::to_string(V) +
                              ") (ignore_index is " + std::to_string(cfg_.ignore_index) + ")");
  st.ce_sum = sums[0];
  st.z_sum = sums[1];
  st.count = counts[0];
  return st;
}

void FusedXent::backward(const uint16_t* h, const uint16_t* W, const int32_t* targets, const uint8_t* mask,
                         const float* lse, int64_t N, float scale, uint16_t* dh, float* dW,
                         cudaStream_t stream) {
  require(N >= 0 && N <= max_tokens_, "FusedXent::backward: N=" + std::to_string(N) +
                                          " outside [0, max_tokens=" + std::to_string(max_tokens_) + "]");
  require(std::isfinite(scale), "FusedXent::backward: scale must be finite");
  if (N == 0 || (!dh && !dW)) return;
  const int64_t V = cfg_.valid_vocab;
  auto per_tile = [&](int64_t r0, int64_t nr, int64_t c, int64_t c0, int64_t nc) {
    grad_tile_kernel<<<unsigned(nr), kThreads, 0, stream>>>(logits_.data(), nc, r0, c0, targets, mask,
                                                            cfg_.ignore_index, V, lse, scale,
                                                            float(cfg_.z_loss), dlogit_.data());
    check(cudaGetLastError(), "FusedXent::backward (dlogit)");
    if (dh)
      gemm_.matmul(Op::N, Op::N, nr, d_, nc, 1.0f, dlogit_.data(), nc, W + c0 * d_, d_, c == 0 ? 0.0f : 1.0f,
                   dh_acc_.data(), OutType::F32, d_, stream);
    if (dW)
      gemm_.matmul(Op::T, Op::N, nc, d_, nr, 1.0f, dlogit_.data(), nc, h + r0 * d_, d_, 1.0f, dW + c0 * d_,
                   OutType::F32, d_, stream);
  };
  auto after_block = [&](int64_t r0, int64_t nr) {
    if (!dh) return;
    to_bf16_kernel<<<dev::grid_for(nr * d_, kThreads), kThreads, 0, stream>>>(dh_acc_.data(), dh + r0 * d_,
                                                                              nr * d_);
    check(cudaGetLastError(), "FusedXent::backward (dh)");
  };
  tiles(h, W, N, stream, per_tile, after_block);
}

void FusedXent::tiles(const uint16_t* h, const uint16_t* W, int64_t N, cudaStream_t stream,
                      const TileFn& per_tile, const std::function<void(int64_t, int64_t)>& after_block) {
  const int64_t V = cfg_.valid_vocab;
  for (int64_t r0 = 0; r0 < N; r0 += block_) {
    const int64_t nr = std::min(block_, N - r0);
    for (int64_t c = 0; c < nchunks_; ++c) {
      const int64_t c0 = c * chunk_, nc = std::min(chunk_, V - c0);
      gemm_.matmul(Op::N, Op::T, nr, nc, d_, 1.0f, h + r0 * d_, d_, W + c0 * d_, d_, 0.0f, logits_.data(),
                   OutType::F32, nc, stream);
      per_tile(r0, nr, c, c0, nc);
    }
    if (after_block) after_block(r0, nr);
  }
}

}  // namespace olmosft::cuda
