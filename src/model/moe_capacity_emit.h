// The latent MoE's routed experts with a capacity (moe.buffer_factor > 0) as StableHLO, for
// MoeUnit::emit_forward / emit_backward (unit_ffn.h; docs/hybrid.md "Capacity on XLA"). The kernel's
// semantics (kernels/moe.h): capacity = ceil(bf * N_r * k / E) per expert, (token, slot) assignments accepted
// in token order, those beyond an expert's capacity dropped (no contribution, no weight gradient). Here:
//   a queue position per (token, expert) from a cumulative sum over tokens of the top-k mask
//   (stablehlo.reduce_window), each kept assignment's row at e * Cb + position of a zero-initialised buffer
//   [E * Cb, Lt] (a scatter whose out-of-range rows, the dropped ones, XLA drops), one batched GEMM per
//   projection over [E, Cb, .], and the outputs read back with a gather of the same rows, weighted and summed
//   over the k slots. Cb = min(N, ceil(bf * N * k / E)) rows per expert (N the program's tokens, padding
//   included, >= N_r), so FLOPs and memory grow with bf * k, not with E. No one-hot [N, E, C] masks.
#pragma once
#include <cstdint>

#include "xla/hlo_builder.h"
#include "xla/ops_dense.h"

namespace olmosft::model::unit::moe_emit {

using xla::HloBuilder;
using xla::Value;

// Where each of the N * k (token, slot) assignments goes.
struct Dispatch {
  Value fid;      // s32 [N * k]: n * E + expert (the assignment's element of an [N, E] array)
  Value dest;     // s32 [N * k]: e * Cb + queue position when kept, else E * Cb (out of range: dropped)
  Value src;      // s32 [N * k]: dest where kept, else 0 (the gathers' rows; their values are masked)
  Value kept;     // f32 [N * k]: 1 = kept
  Value wk;       // f32 [N * k]: the routing weight where kept, else 0
  Value dropped;  // f32 scalar: routed assignments not kept (valid tokens' k slots minus the kept ones)
  int64_t E, k, N, Cb;
};
// IDX s32 [N, k] the chosen experts, SEL f32 [N, E] their 0/1 mask (0 rows for padding), WTS f32 [N, E] the
// routing weights, VALID f32 [N], NR f32 scalar = routed tokens (>= 1), BF the buffer factor (> 0).
Dispatch dispatch(HloBuilder& b, const Value& idx, const Value& sel, const Value& wts, const Value& valid,
                  const Value& nr, double bf);
// The rows per expert of a buffer for N tokens.
int64_t buffer_rows(int64_t N, int64_t E, int64_t k, double bf);
// The capacity ceil(bf k / E * NR) (f32 scalar) for NR routed tokens (f32 scalar).
Value capacity(HloBuilder& b, const Value& nr, int64_t E, int64_t k, double bf);
// The assignments dropped, Σ_e max(0, loads_e - CAP), from the experts' loads [E] (f32 scalar; exact: the
// queue keeps an expert's first min(load, cap) assignments): what dispatch counts, from the router's loads.
Value dropped_over(HloBuilder& b, const Value& loads, const Value& cap);

// The experts' weights stacked (model/xla_params.h): gate, up [E, F, Lt]; down [E, Lt, F].
struct Experts {
  Value g, u, d;
};
// Z [N, Lt] into the buffers [E, Cb, Lt] (zeros where no assignment is kept).
Value to_buffers(HloBuilder& b, const Dispatch& d, const Value& z);
// Each expert's SwiGLU on its buffer X [E, Cb, Lt]: pre-activations A, B [E, Cb, F].
struct ExpertsForward {
  Value a, b;
};
ExpertsForward experts_forward(HloBuilder& b, const Experts& w, const Value& x, xla::ops::Operands o);
// The down projection of H = swiglu(A, B): [E, Cb, Lt].
Value experts_down(HloBuilder& b, const Experts& w, const Value& h, xla::ops::Operands o);
// The routed output [N, Lt]: each token's kept rows of Y [E, Cb, Lt], weighted and summed over its slots.
Value combine(HloBuilder& b, const Dispatch& d, const Value& y);

// The backward from DR = dL/d(routed output) [N, Lt], given the buffers X, the pre-activations A, B:
// dz [N, Lt], the routing weights' gradient dw [N, E] (0 where not kept), and the experts' weight gradients.
struct ExpertsBackward {
  Value dz, dw;
  Value dg, du, dd;  // [E, F, Lt], [E, F, Lt], [E, Lt, F]
};
ExpertsBackward experts_backward(HloBuilder& b, const Dispatch& d, const Experts& w, const Value& x,
                                 const ExpertsForward& f, const Value& dr, xla::ops::Operands o);

}  // namespace olmosft::model::unit::moe_emit
