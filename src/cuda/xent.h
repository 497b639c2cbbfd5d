// Fused LM head + softmax cross-entropy with z-loss on the device (issue 15 item 2), with the semantics of
// src/kernels/cross_entropy.h: h [N, d] bf16 (after the final norm), W [V_rows, d] bf16 (nn.Linear layout),
// int32 targets [N], optional uint8 mask [N]; only W's rows j < valid_vocab take part in the softmax (padded
// rows are as if their logits were -inf and get no gradient). A token is trained when (mask == null ||
// mask[i] != 0) && target != ignore_index; untrained tokens get lse 0, contribute nothing, and get dh = 0.
//   lse = logsumexp_{j<valid} (h W^T)_j,  ce = lse - logit[target],  z = lse^2
//   loss = scale * (ce_sum + z_loss * z_sum),  dlogit_j = scale * (p_j (1 + 2 z_loss lse) - [j == target])
//   dh = dlogit W,  dW += dlogit^T h
// Tiling: a block of row_block consecutive tokens times a chunk of vocab_chunk vocabulary rows at a time.
// Each tile's logits are one cuBLASLt GEMM into an fp32 [row_block, vocab_chunk] buffer (never N x V); the
// forward keeps per (token, chunk) max and sum of exp, combines them per token in chunk order (double) and
// saves lse [N] (fp32); the backward recomputes each tile's logits, turns them into bf16 dlogit and runs two
// GEMMs: dh (fp32 accumulator over the chunks, beta = 1) and dW (fp32, beta = 1). Every sum has a fixed order
// (chunks in order, tokens in order, fixed reduction trees), so results are bitwise reproducible.
// Differences from the CPU kernel: bf16 operands and an fp32 logit tile (the CPU's are fp32/fp64), dlogit is
// rounded to bf16 before the two backward GEMMs, and untrained rows inside a row block are computed and
// masked (not skipped).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "cuda/check.h"
#include "cuda/gemm.h"
#include "kernels/cross_entropy_config.h"

namespace olmosft::cuda {

// The shared configuration and result types (kernels/cross_entropy_config.h, the CPU kernel's; one set of
// defaults), under their old names here too. The kernel reads them as the CPU's with two differences:
// vocab_chunk and row_block must be > 0 (no untiled mode: the constructor throws), and z_loss is used as
// float(z_loss), checked finite and >= 0 after that rounding. The default tiles are the CPU's; a caller sizes
// them for the device.
using ::olmosft::XentConfig;
using ::olmosft::XentStats;

class FusedXent {
 public:
  // Allocates the tiles (cudaMalloc) for up to max_tokens tokens of width d and a head of V_rows rows.
  // Throws std::invalid_argument naming the bad field.
  FusedXent(Gemm& gemm, int64_t max_tokens, int64_t d, int64_t V_rows, const XentConfig& cfg);

  // lse [N] fp32 out. Synchronizes the stream (the sums come back to the host). A trained token whose target
  // is outside [0, valid_vocab) makes it throw std::invalid_argument (after the launch; outputs are then
  // undefined).
  XentStats forward(const uint16_t* h, const uint16_t* W, const int32_t* targets, const uint8_t* mask,
                    int64_t N, float* lse, cudaStream_t stream = nullptr);
  // dh [N, d] bf16 overwritten (may be null), dW [V_rows, d] fp32 accumulated, rows >= valid_vocab untouched
  // (may be null). lse from forward. Does not synchronize.
  void backward(const uint16_t* h, const uint16_t* W, const int32_t* targets, const uint8_t* mask,
                const float* lse, int64_t N, float scale, uint16_t* dh, float* dW,
                cudaStream_t stream = nullptr);

  // Bytes of device memory the tiles take.
  size_t workspace_bytes() const;

 private:
  // For each row block and vocabulary chunk in order: the tile's logits into logits_ (one GEMM), then
  // per_tile(r0, nr, c, c0, nc); after each row block's last chunk, after_block(r0, nr) (if given).
  using TileFn = std::function<void(int64_t, int64_t, int64_t, int64_t, int64_t)>;
  void tiles(const uint16_t* h, const uint16_t* W, int64_t N, cudaStream_t stream, const TileFn& per_tile,
             const std::function<void(int64_t, int64_t)>& after_block);

  Gemm& gemm_;
  int64_t max_tokens_, d_, V_rows_, chunk_, block_, nchunks_;
  XentConfig cfg_;
  DeviceArray<float> logits_;               // [block, chunk] fp32 logit tile
  DeviceArray<uint16_t> dlogit_;            // [block, chunk] bf16 gradient tile
  DeviceArray<float> dh_acc_;               // [block, d]
  DeviceArray<float> part_max_, part_sum_;  // [max_tokens, nchunks]
  DeviceArray<float> tgt_logit_;            // [max_tokens]
  DeviceArray<double> row_ce_, row_z_;      // [max_tokens]
  DeviceArray<double> sums_;                // [2]: ce_sum, z_sum
  DeviceArray<int64_t> counts_;             // [2]: trained, bad targets
};

}  // namespace olmosft::cuda
