// Kimi Delta Attention (KDA) kernels, forward and backward, for the Olmo 3.5 KDA layers
// (docs/reference/architecture.md B.4 and Part C). Every piece is a separate function so the model layer
// composes them around its projections (GEMMs are outside these kernels):
//
//   q_c = SiLU(ShortConv(q_in))  k_c = ...  v_c = ...          short_conv_silu_*   (kda_conv.cpp)
//   q_n = L2Norm(q_c per head)   k_n = L2Norm(k_c per head)     l2norm_*            (kda_l2norm.cpp)
//   g = -exp(A_log[h]) * softplus(f + dt_bias)                  kda_gate_*          (kda_gate.cpp)
//   beta = 2*sigmoid(b)  (sigmoid(b) without allow_neg_eigval)  kda_beta_*          (kda_gate.cpp)
//   o = DeltaRule(scale*q_n, k_n, v_c, g, beta)                 kda_recurrent_* / kda_chunk_*
//   y = RMSNorm(o per head) * w * sigmoid(z)                    kda_output_norm_*   (kda_gate.cpp)
//
// All kernels are templated over float and double (explicitly instantiated for both) so float64 finite
// differences run through the same code. Layout: packed rows, token-major. A batch holds B rows of L tokens;
// activations are [B, L, H, D] row-major (= the [B*L, H*D] output of a projection). `seg` holds B*L int32
// segment ids (may be nullptr: one document per row, no padding).
//
// Segments: a document is a maximal run of equal, non-negative segment ids within a row; a new document
// starts at t = 0 and wherever seg[t] != seg[t-1]. Tokens with a negative id are padding: they are a no-op
// (no decay, no state update, zero output, zero gradient) and also end the current document.
// Across documents nothing is shared: the conv window and the delta-rule state restart at zero.
//
// Gradient convention: gradients w.r.t. activations are written (overwritten); gradients w.r.t. parameters
// (conv weight, A_log, dt_bias, output-norm weight) are ACCUMULATED (+=) so layers can sum over
// micro-batches.
#pragma once
#include <cstdint>
#include <vector>

namespace olmosft::kda {

// For every token of a [B, L] batch: the in-row index of the first token of its document, or -1 for
// padding. Exposed for the model layer and the tests.
std::vector<int64_t> segment_starts(const int32_t* seg, int64_t B, int64_t L);

// ---------------------------------------------------------------------------------------------------------
// 1. Causal depthwise short convolution (nn.Conv1d(C, C, K, groups=C, padding=K-1, bias=False), weight
//    [C, 1, K]) followed by SiLU:  pre[t,c] = sum_j w[c,j] * x[t-K+1+j, c]  (x before the document start
//    = 0), y = silu(pre). Padding tokens give y = 0. x, y, dx: [B, L, C]; w, dw: [C, K] (dw accumulated).
template <typename T>
void short_conv_silu_forward(const T* x, const T* w, const int32_t* seg, int64_t B, int64_t L, int64_t C,
                             int64_t K, T* y);
template <typename T>
void short_conv_silu_backward(const T* x, const T* w, const int32_t* seg, int64_t B, int64_t L, int64_t C,
                              int64_t K, const T* dy, T* dx, T* dw);

// ---------------------------------------------------------------------------------------------------------
// 2. L2 normalisation of each of the N rows of length D (fla l2norm: y = x / sqrt(sum x^2 + eps),
//    eps = 1e-6 inside the sqrt). Backward recomputes from x.
constexpr double kL2NormEps = 1e-6;
template <typename T>
void l2norm_forward(const T* x, int64_t N, int64_t D, T eps, T* y);
template <typename T>
void l2norm_backward(const T* x, const T* dy, int64_t N, int64_t D, T eps, T* dx);

// ---------------------------------------------------------------------------------------------------------
// 3. Gate. f: [N, H, K] raw decay (output of f_proj_2), A_log: [H], dt_bias: [H*K].
//    g[n,h,c] = -exp(A_log[h]) * softplus(f[n,h,c] + dt_bias[h*K+c])  (log-space, <= 0; torch softplus with
//    threshold 20). Backward: df written; dA_log, ddt_bias accumulated.
template <typename T>
void kda_gate_forward(const T* f, const T* A_log, const T* dt_bias, int64_t N, int64_t H, int64_t K, T* g);
template <typename T>
void kda_gate_backward(const T* f, const T* A_log, const T* dt_bias, const T* dg, int64_t N, int64_t H,
                       int64_t K, T* df, T* dA_log, T* ddt_bias);

// beta = 2*sigmoid(b) when allow_neg_eigval (beta in (0,2)), else sigmoid(b). b, beta, db: [n].
template <typename T>
void kda_beta_forward(const T* b, int64_t n, bool allow_neg_eigval, T* beta);
template <typename T>
void kda_beta_backward(const T* b, const T* dbeta, int64_t n, bool allow_neg_eigval, T* db);

// ---------------------------------------------------------------------------------------------------------
// 4. Gated delta rule (docs/reference/architecture.md C.1), per (row, head), state S [K, V] starting at 0 at
// every
//    document start:
//      S' = Diag(exp(g_t)) S;  u = beta_t (v_t - S'^T k_t);  S = S' + k_t u^T;  o_t = S^T (scale * q_t)
//    q, k, g, dq, dk, dg: [B, L, H, K]; v, o, dv, do: [B, L, H, V]; beta, dbeta: [B, L, H].
//    scale is normally K^-1/2 (fla chunk_kda default). q and k are expected L2-normalised (not required).
struct KdaDims {
  int64_t B = 1, L = 0, H = 1, K = 0, V = 0;
};

// (a) Reference: token-by-token recurrence. Backward runs the reverse-time recurrence (C.2), recomputing
//     states from checkpoints stored every `ckpt` tokens (memory O(L/ckpt * K*V + ckpt * K*V) per head).
template <typename T>
void kda_recurrent_forward(const T* q, const T* k, const T* v, const T* g, const T* beta, const int32_t* seg,
                           const KdaDims& d, T scale, T* o);
template <typename T>
void kda_recurrent_backward(const T* q, const T* k, const T* v, const T* g, const T* beta, const int32_t* seg,
                            const KdaDims& d, T scale, const T* dout, T* dq, T* dk, T* dv, T* dg, T* dbeta,
                            int64_t ckpt = 64);

// (b) Chunked WY/UT form (C.3) with chunk size `chunk` (default 64). Chunks never span documents: each
//     document is split into chunks of `chunk` tokens starting at its first token, the last one partial
//     (fla's cu_seqlens layout). The backward stores the state at each chunk start of the document being
//     processed (memory O(document length/chunk * K*V) per thread).
//     vn (optional, [B, L, H, V] like o): the forward writes each token's pseudo-value Vn = U - W S (the
//     delta rule's corrected value, the same size as o; zero at padding), and a backward given the same
//     array reads it instead of recomputing it: its state pass is then one GEMM per chunk, with no solves or
//     pairwise terms (about 1.2x faster forward + backward at dk 128, dv 256; bench/RESULTS.md "bench_kda").
//     Without vn (nullptr) the backward recomputes Vn from the inputs.
//     Inside a chunk, pairs of tokens in different sub-chunks of kChunkSub tokens are computed as GEMMs
//     (factored decays), pairs in the same sub-chunk directly (train/flops.cpp counts them so).
constexpr int64_t kChunkSub = 8;
template <typename T>
void kda_chunk_forward(const T* q, const T* k, const T* v, const T* g, const T* beta, const int32_t* seg,
                       const KdaDims& d, T scale, T* o, int64_t chunk = 64, T* vn = nullptr);
template <typename T>
void kda_chunk_backward(const T* q, const T* k, const T* v, const T* g, const T* beta, const int32_t* seg,
                        const KdaDims& d, T scale, const T* dout, T* dq, T* dk, T* dv, T* dg, T* dbeta,
                        int64_t chunk = 64, const T* vn = nullptr);

// ---------------------------------------------------------------------------------------------------------
// 5. Gated output RMSNorm (fla FusedRMSNormGated): for each of the N rows (token, head) of length D:
//      y = o * rsqrt(mean(o^2) + eps) * w * act(z),   act = sigmoid (KDA) or silu(z) = z sigmoid(z) (GDN).
//    w: [D] shared by all heads. eps = 1e-5. act'(z): sigmoid s(1-s); silu s(1 + z(1-s)).
//    Backward: do, dz written; dw accumulated.
enum class GateAct { Sigmoid, Silu };
template <typename T>
void kda_output_norm_forward(const T* o, const T* z, const T* w, int64_t N, int64_t D, T eps, T* y,
                             GateAct act = GateAct::Sigmoid);
template <typename T>
void kda_output_norm_backward(const T* o, const T* z, const T* w, const T* dy, int64_t N, int64_t D, T eps,
                              T* dout, T* dz, T* dw, GateAct act = GateAct::Sigmoid);

}  // namespace olmosft::kda
