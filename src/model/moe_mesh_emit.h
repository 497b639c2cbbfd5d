// The latent MoE's routed experts with a capacity (moe.buffer_factor > 0) over a device mesh: expert
// parallelism (docs/hybrid.md "Experts over the mesh"). The experts' stacks (model/xla_params.h) are split on
// E over every device (E / D experts each, Olmo 3.5 small: 512 over 128 chips = 4); the tokens stay in the
// mesh's blocked layout (xla/mesh.h). One manual region over the whole mesh (as the context-parallel
// attention, xla/ops_attention.cpp) where each device
//   all-gathers the routing (the chosen experts idx [N, k], the valid mask, the picks' weights) and the
//     latent input z [N, Lt] (in the GEMMs' operand type: bf16 when operands are, exact, z only feeds GEMMs);
//   takes the queue positions of its own experts' assignments in the batch's row-major token order (a
//     cumulative sum over [N, E / D]), which is the CPU kernel's order (kernels/moe.h), so that the same
//     assignments are kept as on one device and on the CPU backend, capacity ceil(bf N_r k / E) per expert
//     over the whole micro-batch;
//   fills its buffers [E / D, Cb, Lt] by a gather of z through a slot -> assignment map (a scatter of the
//     kept assignments' indices), runs its experts' batched GEMMs, and scatter-adds the weighted outputs
//     into an [N, Lt] partial that is reduce-scattered to the tokens' own devices (Megatron's all-gather
//     token dispatcher).
// The backward does the same with dL/d(routed output) gathered: dz and the routing weights' gradient
// reduce-scattered back to the tokens, the experts' weight gradients local (no collective). No all-to-all:
// a fixed-size one needs a per-(device, expert) capacity, which keeps other assignments than the global
// queue. Data replicas are refused (the queue is the micro-batch's, over all its rows).
#pragma once
#include <cstdint>

#include "model/moe_capacity_emit.h"
#include "xla/mesh.h"

namespace olmosft::model::unit::moe_emit {

// What the region reads, each a whole (global) array of the SPMD program.
struct MeshRouted {
  const xla::Mesh& mesh;
  int64_t B, T;  // the token array's rows as Emit lays it out: [B, T], or row tiles [B * C, T / C]
  double bf;     // moe.buffer_factor (> 0)
  xla::ops::Operands o;
  Value z;      // f32 [N, Lt] the latent input, tokens in the blocked order
  Value idx;    // s32 [N, k] the chosen experts
  Value valid;  // f32 [N] 1 = routed token
  Value wts;    // f32 [N, E] the routing weights
  Value cap;    // f32 scalar: capacity()
};
// Whether a MoE layer's experts run over MESH (null: one device) with buffer factor BF: a capacity (BF > 0)
// over several devices.
bool experts_over_mesh(const xla::Mesh* mesh, double bf);
// Refuses, naming the mesh, what expert parallelism does not split: data replicas, E not a multiple of the
// devices, N tokens that do not split (N 0: not checked).
void check_mesh_experts(const xla::Mesh& mesh, int64_t E, int64_t N);

struct MeshForward {
  Value r;     // [N, Lt] the routed output (before the latent up projection)
  Value a, b;  // [E, Cb, F] the experts' gate / up pre-activations on their buffers, split over E
};
MeshForward mesh_forward(HloBuilder& b, const MeshRouted& in, const Experts& w);

// From DR = dL/dr [N, Lt] and the forward's A, B: dz [N, Lt], dw [N, E] (0 where not kept), and the stacks'
// gradients, split as the stacks.
ExpertsBackward mesh_backward(HloBuilder& b, const MeshRouted& in, const Experts& w, const Value& a,
                              const Value& bb, const Value& dr);

}  // namespace olmosft::model::unit::moe_emit
