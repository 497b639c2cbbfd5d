// Softmax attention over packed rows (causal, optional sliding window, document masking by segment id,
// GQA), forward and backward, FlashAttention-2 style: tiled over blocks of queries and keys with an online
// softmax, so nothing of size T x T is ever materialised. The forward saves the per-(head, query)
// logsumexp; the backward recomputes the probabilities from q, k and that logsumexp.
//
// Layouts (all row-major, contiguous; B packed rows of T tokens each):
//   q   [B, T, H,   D ]      k [B, T, Hkv, D ]      v [B, T, Hkv, Dv]
//   seg [B, T] int32         o [B, T, H,   Dv]      lse [B, H, T]
// Mask: query i (in row b) sees key j iff
//   seg[i] >= 0, seg[j] == seg[i], j <= i, and (window <= 0 or i - j < window).
// A negative segment id marks a padding token: its output row is zero, its lse is -inf, nobody attends
// to it and it receives zero gradient. Each non-negative id must form ONE contiguous run in its row
// (documents are packed back to back; ids may repeat across rows but not within a row after a
// different id); anything else is rejected with an olmosft::Error.
// GQA: kv head j serves q heads j*G .. j*G+G-1, G = H / Hkv.
//
// Memory: the caller provides a workspace whose size attention_*_workspace_bytes() returns; it is
// linear in B*T (per-token metadata, the backward's D_i = rowsum(dO*O)) plus per-thread tiles that do
// not depend on T. The kernels allocate nothing else.
//
// Templated over float and double: double runs through the same code (and cblas_dgemm), which is how
// the finite-difference tests check the backward.
#pragma once
#include <cstddef>
#include <cstdint>

namespace olmosft {

struct AttentionConfig {
  int64_t batch = 1;       // B packed rows
  int64_t seq = 0;         // T tokens per row
  int64_t heads = 0;       // H query heads
  int64_t kv_heads = 0;    // Hkv key/value heads (H % Hkv == 0)
  int64_t head_dim = 0;    // D (q and k)
  int64_t v_head_dim = 0;  // Dv
  int64_t window = 0;      // sliding window W (key j visible iff 0 <= i - j < W); <= 0 means full causal
  double scale = 0.0;      // softmax scale applied to q.k (the model passes D^-0.5); must be finite
  int threads = 0;         // OpenMP threads; 0 = num_threads() at the time of the call
};

enum class AttentionTileBackend {
  kBlas,   // cblas_sgemm / cblas_dgemm for every tile product (default; measured faster, see docs/attn.md)
  kLoops,  // register-blocked, `omp simd` vectorised loops (kept for the comparison and as a fallback)
};
// Process-wide choice of the tile-product implementation (for benchmarks and tests).
void set_attention_tile_backend(AttentionTileBackend b);
AttentionTileBackend attention_tile_backend();

// Block sizes: queries per tile and keys per tile.
constexpr int64_t kAttnBlockQ = 64;
constexpr int64_t kAttnBlockK = 64;

// Validates the config (throws olmosft::Error naming the bad field).
void attention_validate(const AttentionConfig& c);

// Workspace sizes in bytes for the given scalar type (float or double). Linear in batch*seq.
template <typename T>
size_t attention_forward_workspace_bytes(const AttentionConfig& c);
template <typename T>
size_t attention_backward_workspace_bytes(const AttentionConfig& c);

// Forward. Writes o [B,T,H,Dv] and lse [B,H,T]. `workspace` must be 64-byte aligned (or at least aligned
// for T) and hold attention_forward_workspace_bytes<T>(c) bytes.
template <typename T>
void attention_forward(const AttentionConfig& c, const T* q, const T* k, const T* v, const int32_t* seg, T* o,
                       T* lse, void* workspace, size_t workspace_bytes);

// Backward. Given dout = dL/do, OVERWRITES dq [B,T,H,D], dk [B,T,Hkv,D], dv [B,T,Hkv,Dv] (not accumulated).
// o and lse must come from attention_forward on the same inputs.
template <typename T>
void attention_backward(const AttentionConfig& c, const T* q, const T* k, const T* v, const int32_t* seg,
                        const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv, void* workspace,
                        size_t workspace_bytes);

// Per-row document check used by both passes (exposed for tests): throws unless every non-negative id
// of seg[0..T) forms one contiguous run. `row` names the row in the error message.
void attention_check_segments(const int32_t* seg, int64_t T, int64_t row);

}  // namespace olmosft
