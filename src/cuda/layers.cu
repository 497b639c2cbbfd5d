#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "cuda/device_util.cuh"
#include "cuda/layers.h"

namespace olmosft::cuda {
namespace {

using dev::ld_bf16;
using dev::to_bf16;

constexpr unsigned kRowThreads = 256;

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}
void launched(const char* what) { check(cudaGetLastError(), what); }

// ---- RMSNorm ----

__device__ float row_rstd(const uint16_t* xi, int64_t D, float eps, float* smem) {
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = ld_bf16(xi, j);
    ss += v * v;
  }
  ss = dev::block_sum(ss, smem);
  return 1.0f / sqrtf(ss / float(D) + eps);
}

__global__ void rmsnorm_fwd_kernel(const uint16_t* x, const uint16_t* w, uint16_t* y, float* rstd, int64_t D,
                                   float eps) {
  __shared__ float smem[32];
  const int64_t i = blockIdx.x;
  const uint16_t* xi = x + i * D;
  uint16_t* yi = y + i * D;
  const float r = row_rstd(xi, D, eps, smem);
  if (rstd && threadIdx.x == 0) rstd[i] = r;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float n = ld_bf16(xi, j) * r;
    yi[j] = to_bf16(w ? ld_bf16(w, j) * n : n);
  }
}

// dx for row blockIdx.x; r_out (if given) receives the row's r for the dw kernels.
__global__ void rmsnorm_bwd_dx_kernel(const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                                      const float* rstd, uint16_t* dx, float* r_out, int64_t D, float eps) {
  __shared__ float smem[32];
  const int64_t i = blockIdx.x;
  const uint16_t *xi = x + i * D, *dyi = dy + i * D;
  uint16_t* dxi = dx + i * D;
  const float r = rstd ? rstd[i] : row_rstd(xi, D, eps, smem);
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float g = w ? ld_bf16(w, j) * ld_bf16(dyi, j) : ld_bf16(dyi, j);
    dot += ld_bf16(xi, j) * g;
  }
  dot = dev::block_sum(dot, smem);
  const float c = r * r * r * dot / float(D);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float g = w ? ld_bf16(w, j) * ld_bf16(dyi, j) : ld_bf16(dyi, j);
    dxi[j] = to_bf16(r * g - ld_bf16(xi, j) * c);
  }
  if (r_out && threadIdx.x == 0) r_out[i] = r;
}

// part[p, j] = sum over rows of block p (ascending) of dy * x * r; grid (ceil(D / threads), P).
__global__ void rmsnorm_dw_partial_kernel(const uint16_t* dy, const uint16_t* x, const float* r, float* part,
                                          int64_t N, int64_t D, int64_t P) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, p = blockIdx.y;
  if (j >= D) return;
  float s = 0.f;
  for (int64_t i = N * p / P; i < N * (p + 1) / P; ++i)
    s += ld_bf16(dy, i * D + j) * ld_bf16(x, i * D + j) * r[i];
  part[p * D + j] = s;
}

__global__ void rmsnorm_dw_sum_kernel(const float* part, float* dw, int64_t D, int64_t P) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= D) return;
  float s = 0.f;
  for (int64_t p = 0; p < P; ++p) s += part[p * D + j];
  dw[j] += s;
}

int64_t dw_blocks(int64_t N) { return std::max<int64_t>(1, std::min<int64_t>(64, N)); }

// ---- SwiGLU ----

__global__ void swiglu_fwd_kernel(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* h,
                                  int64_t ldh, int64_t N, int64_t F) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < N * F;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / F, j = idx % F;
    const float x = ld_bf16(a, i * lda + j);
    h[i * ldh + j] = to_bf16(x / (1.0f + expf(-x)) * ld_bf16(b, i * ldb + j));
  }
}

__global__ void swiglu_bwd_kernel(const uint16_t* dh, int64_t lddh, const uint16_t* a, int64_t lda,
                                  const uint16_t* b, int64_t ldb, uint16_t* da, int64_t ldda, uint16_t* db,
                                  int64_t lddb, int64_t N, int64_t F) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < N * F;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / F, j = idx % F;
    const float x = ld_bf16(a, i * lda + j), g = ld_bf16(dh, i * lddh + j);
    const float sg = 1.0f / (1.0f + expf(-x));
    if (db) db[i * lddb + j] = to_bf16(g * (x * sg));
    if (da) da[i * ldda + j] = to_bf16(g * ld_bf16(b, i * ldb + j) * (sg * (1.0f + x * (1.0f - sg))));
  }
}

// ---- RoPE ----

template <bool Backward>
__global__ void rope_kernel(uint16_t* x, const float* cos, const float* sin, int64_t H, int64_t D,
                            int64_t ld_tok) {
  const int64_t t = blockIdx.x, half = D / 2;
  const float *c = cos + t * half, *s = sin + t * half;
  for (int64_t k = threadIdx.x; k < H * half; k += blockDim.x) {
    const int64_t h = k / half, i = k % half;
    uint16_t* x1 = x + t * ld_tok + h * D;
    const float a = ld_bf16(x1, i), bb = ld_bf16(x1, i + half);
    if constexpr (!Backward) {
      x1[i] = to_bf16(a * c[i] - bb * s[i]);
      x1[i + half] = to_bf16(bb * c[i] + a * s[i]);
    } else {
      x1[i] = to_bf16(a * c[i] + bb * s[i]);
      x1[i + half] = to_bf16(bb * c[i] - a * s[i]);
    }
  }
}

template <bool Backward>
void rope_launch(uint16_t* x, const float* cos, const float* sin, int64_t ntok, int64_t H, int64_t D,
                 int64_t ld_tok, cudaStream_t stream, const char* who) {
  require(D > 0 && D % 2 == 0 && H > 0 && ntok >= 0,
          std::string(who) + ": bad shape ntok=" + std::to_string(ntok) + " H=" + std::to_string(H) +
              " D=" + std::to_string(D));
  require(ld_tok >= H * D, std::string(who) + ": token stride " + std::to_string(ld_tok) + " < H*D");
  if (ntok == 0) return;
  rope_kernel<Backward><<<unsigned(ntok), 128, 0, stream>>>(x, cos, sin, H, D, ld_tok);
  launched(who);
}

// ---- Embedding ----

__global__ void embedding_fwd_kernel(const int32_t* tokens, const uint16_t* table, uint16_t* out, int64_t d) {
  const int64_t t = blockIdx.x;
  const uint16_t* row = table + int64_t(tokens[t]) * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[t * d + j] = row[j];
}

__global__ void embedding_bwd_kernel(const int32_t* tokens, const int32_t* sorted_pos,
                                     const int32_t* run_start, const uint16_t* dout, float* dtable,
                                     int64_t d) {
  const int64_t r = blockIdx.x;
  const int32_t b = run_start[r], e = run_start[r + 1];
  const int64_t v = tokens[sorted_pos[b]];
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float s = 0.f;
    for (int32_t k = b; k < e; ++k) s += ld_bf16(dout, int64_t(sorted_pos[k]) * d + j);
    dtable[v * d + j] += s;
  }
}

}  // namespace

void rmsnorm_forward(const uint16_t* x, const uint16_t* w, uint16_t* y, float* rstd, int64_t N, int64_t D,
                     float eps, cudaStream_t stream) {
  require(N >= 0 && D > 0 && eps >= 0,
          "rmsnorm_forward: bad shape N=" + std::to_string(N) + " D=" + std::to_string(D) + " or eps < 0");
  if (N == 0) return;
  rmsnorm_fwd_kernel<<<unsigned(N), kRowThreads, 0, stream>>>(x, w, y, rstd, D, eps);
  launched("rmsnorm_forward");
}

int64_t rmsnorm_backward_workspace(int64_t N, int64_t D) { return dw_blocks(N) * D + N; }

void rmsnorm_backward(const uint16_t* dy, const uint16_t* x, const uint16_t* w, const float* rstd,
                      uint16_t* dx, float* dw, float* workspace, int64_t N, int64_t D, float eps,
                      cudaStream_t stream) {
  require(N >= 0 && D > 0 && eps >= 0,
          "rmsnorm_backward: bad shape N=" + std::to_string(N) + " D=" + std::to_string(D) + " or eps < 0");
  const bool want_dw = w != nullptr && dw != nullptr;
  require(!want_dw || workspace,
          "rmsnorm_backward: dw needs a workspace of rmsnorm_backward_workspace floats");
  if (N == 0) return;
  const int64_t P = dw_blocks(N);
  float* r_saved = want_dw ? workspace + P * D : nullptr;
  rmsnorm_bwd_dx_kernel<<<unsigned(N), kRowThreads, 0, stream>>>(dy, x, w, rstd, dx, r_saved, D, eps);
  launched("rmsnorm_backward (dx)");
  if (!want_dw) return;
  const unsigned cols = unsigned((D + 255) / 256);
  rmsnorm_dw_partial_kernel<<<dim3(cols, unsigned(P)), 256, 0, stream>>>(dy, x, r_saved, workspace, N, D, P);
  launched("rmsnorm_backward (dw partial)");
  rmsnorm_dw_sum_kernel<<<cols, 256, 0, stream>>>(workspace, dw, D, P);
  launched("rmsnorm_backward (dw sum)");
}

void swiglu_forward(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* h, int64_t ldh,
                    int64_t N, int64_t F, cudaStream_t stream) {
  require(N >= 0 && F >= 0 && (N <= 1 || (lda >= F && ldb >= F && ldh >= F)),
          "swiglu_forward: bad shape or leading dimension < F=" + std::to_string(F));
  if (N * F == 0) return;
  swiglu_fwd_kernel<<<dev::grid_for(N * F, 256), 256, 0, stream>>>(a, lda, b, ldb, h, ldh, N, F);
  launched("swiglu_forward");
}

void swiglu_backward(const uint16_t* dh, int64_t lddh, const uint16_t* a, int64_t lda, const uint16_t* b,
                     int64_t ldb, uint16_t* da, int64_t ldda, uint16_t* db, int64_t lddb, int64_t N,
                     int64_t F, cudaStream_t stream) {
  require(N >= 0 && F >= 0 && (N <= 1 || (lddh >= F && lda >= F && ldb >= F && ldda >= F && lddb >= F)),
          "swiglu_backward: bad shape or leading dimension < F=" + std::to_string(F));
  if (N * F == 0 || (!da && !db)) return;
  swiglu_bwd_kernel<<<dev::grid_for(N * F, 256), 256, 0, stream>>>(dh, lddh, a, lda, b, ldb, da, ldda, db,
                                                                   lddb, N, F);
  launched("swiglu_backward");
}

void rope_forward(uint16_t* x, const float* cos, const float* sin, int64_t ntok, int64_t H, int64_t D,
                  int64_t ld_tok, cudaStream_t stream) {
  rope_launch<false>(x, cos, sin, ntok, H, D, ld_tok, stream, "rope_forward");
}
void rope_backward(uint16_t* dx, const float* cos, const float* sin, int64_t ntok, int64_t H, int64_t D,
                   int64_t ld_tok, cudaStream_t stream) {
  rope_launch<true>(dx, cos, sin, ntok, H, D, ld_tok, stream, "rope_backward");
}

EmbeddingBatch::EmbeddingBatch(const std::vector<int32_t>& tokens, int64_t vocab)
    : ntok_(int64_t(tokens.size())) {
  require(vocab > 0, "EmbeddingBatch: vocab must be > 0");
  require(ntok_ < (int64_t(1) << 31), "EmbeddingBatch: too many tokens");
  for (size_t t = 0; t < tokens.size(); ++t)
    require(tokens[t] >= 0 && tokens[t] < vocab,
            "EmbeddingBatch: token " + std::to_string(tokens[t]) + " at position " + std::to_string(t) +
                " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  std::vector<int32_t> pos(tokens.size());
  std::iota(pos.begin(), pos.end(), 0);
  std::stable_sort(pos.begin(), pos.end(),
                   [&](int32_t a, int32_t b) { return tokens[size_t(a)] < tokens[size_t(b)]; });
  std::vector<int32_t> starts;
  for (size_t k = 0; k < pos.size(); ++k)
    if (k == 0 || tokens[size_t(pos[k])] != tokens[size_t(pos[k - 1])]) starts.push_back(int32_t(k));
  nruns_ = int64_t(starts.size());
  starts.push_back(int32_t(pos.size()));
  tokens_ = DeviceArray<int32_t>(tokens);
  sorted_pos_ = DeviceArray<int32_t>(pos);
  run_start_ = DeviceArray<int32_t>(starts);
}

void EmbeddingBatch::forward(const uint16_t* table, uint16_t* out, int64_t d, cudaStream_t stream) const {
  require(d > 0, "EmbeddingBatch::forward: d must be > 0");
  if (ntok_ == 0) return;
  embedding_fwd_kernel<<<unsigned(ntok_), 128, 0, stream>>>(tokens_.data(), table, out, d);
  launched("EmbeddingBatch::forward");
}

void EmbeddingBatch::backward(const uint16_t* dout, float* dtable, int64_t d, cudaStream_t stream) const {
  require(d > 0, "EmbeddingBatch::backward: d must be > 0");
  if (nruns_ == 0) return;
  embedding_bwd_kernel<<<unsigned(nruns_), 128, 0, stream>>>(tokens_.data(), sorted_pos_.data(),
                                                             run_start_.data(), dout, dtable, d);
  launched("EmbeddingBatch::backward");
}

}  // namespace olmosft::cuda
