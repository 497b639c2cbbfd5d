// Dense SwiGLU MLP and latent MoE units (see unit_ffn.h).
#include "model/unit_ffn.h"

#include <cmath>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/swiglu.h"
#include "model/moe_capacity_emit.h"
#include "model/moe_mesh_emit.h"
#include "model/params.h"

namespace olmosft::model::unit {

namespace {

template <typename T>
moe::MoeDims moe_dims(const Ctx<T>& ctx) {
  const ModelConfig& c = ctx.c;
  moe::MoeDims m;
  m.d = ctx.d;
  m.experts = c.n_routed_experts;
  m.top_k = c.num_experts_per_tok;
  m.expert_hidden = c.moe_intermediate_size;
  m.latent = c.latent_moe_dim;
  m.shared_hidden = c.shared_expert_intermediate_size;
  if (c.original_num_experts_per_tok && *c.original_num_experts_per_tok != c.num_experts_per_tok)
    m.weight_mult = std::sqrt(static_cast<double>(*c.original_num_experts_per_tok) /
                              static_cast<double>(c.num_experts_per_tok));
  m.buffer_factor = ctx.loss->moe_buffer_factor;
  return m;
}

// Refills a pointer table m (moe::MoeWeights or MoeGrads; its vectors keep their capacity) with at(index):
// the tensor's values or gradient, nullptr for an absent tensor (index < 0).
template <typename Table, typename At>
void moe_table(const MoeUnit& u, At at, Table& m) {
  m.router = at(u.router);
  m.latent_down = at(u.ldown);
  m.latent_up = at(u.lup);
  m.gate.resize(u.eg.size());
  m.up.resize(u.eg.size());
  m.down.resize(u.eg.size());
  for (size_t e = 0; e < u.eg.size(); ++e) {
    m.gate[e] = at(u.eg[e]);
    m.up[e] = at(u.eu[e]);
    m.down[e] = at(u.ed[e]);
  }
  m.shared_gate = at(u.sh_g);
  m.shared_up = at(u.sh_u);
  m.shared_down = at(u.sh_d);
}

template <typename T>
void moe_weights(const MoeUnit& u, const Ctx<T>& ctx, moe::MoeWeights<T>& m) {
  moe_table(
      u, [&](int i) { return i < 0 ? nullptr : ctx.W(i); }, m);
}

template <typename T>
void moe_grads(const MoeUnit& u, const Ctx<T>& ctx, moe::MoeGrads<T>& m) {
  moe_table(
      u, [&](int i) { return ctx.G(i); }, m);
}

}  // namespace

void SwiGluUnit::params(Params& p, const ModelConfig& c, const std::string& m, int64_t F) {
  const int64_t d = c.hidden_size;
  p.add(gate, m + hf::kGateProj, {F, d});
  p.add(up, m + hf::kUpProj, {F, d});
  p.add(down, m + hf::kDownProj, {d, F});
  hidden = F;
}

template <typename T>
void SwiGluUnit::forward(const Ctx<T>& ctx, const T* x, T* f, const Saved<T>& s, const Scratch<T>& w) const {
  const int64_t N = ctx.N, d = ctx.d, F = hidden;
  linear_forward(x, ctx.W(gate), s.a, N, d, F);
  linear_forward(x, ctx.W(up), s.b, N, d, F);
  swiglu_forward(s.a, s.b, w.act, N * F);
  linear_forward(w.act, ctx.W(down), f, N, F, d);
}

template <typename T>
void SwiGluUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* df, T* dx,
                          const Scratch<T>& w) const {
  const int64_t N = ctx.N, d = ctx.d, F = hidden;
  swiglu_forward(s.a, s.b, w.act, N * F);  // recompute the hidden product
  linear_backward(df, w.act, ctx.W(down), w.dact, ctx.G(down), N, F, d);
  // da (gate) overwrites dact (each element's dh is read before it is written); db (up) goes to act.
  swiglu_backward(w.dact, F, s.a, F, s.b, F, w.dact, F, w.act, F, N, F);
  linear_backward(w.dact, x, ctx.W(gate), dx, ctx.G(gate), N, d, F, true);
  linear_backward(w.act, x, ctx.W(up), dx, ctx.G(up), N, d, F, true);
}

xla::Value SwiGluUnit::emit_forward(Emit& e, const xla::Value& x, Emitted& s) const {
  s.a = xla::ops::linear_forward(e.b, x, e.W(gate), e.operands);
  s.b = xla::ops::linear_forward(e.b, x, e.W(up), e.operands);
  return xla::ops::linear_forward(e.b, xla::ops::swiglu_forward(e.b, *s.a, *s.b), e.W(down), e.operands);
}

xla::Value SwiGluUnit::emit_backward(Emit& e, const xla::Value& x, const Emitted& s,
                                     const xla::Value& df) const {
  namespace ops = xla::ops;
  const xla::Value act = ops::swiglu_forward(e.b, *s.a, *s.b);
  const ops::LinearBackward ld = ops::linear_backward(e.b, df, act, e.W(down), e.operands);
  const ops::SwigluBackward sb = ops::swiglu_backward(e.b, ld.dx, *s.a, *s.b);
  const ops::LinearBackward lg = ops::linear_backward(e.b, sb.da, x, e.W(gate), e.operands);
  const ops::LinearBackward lu = ops::linear_backward(e.b, sb.db, x, e.W(up), e.operands);
  e.grad(down, ld.dw);
  e.grad(gate, lg.dw);
  e.grad(up, lu.dw);
  return e.b.add(lg.dx, lu.dx);
}

void MoeUnit::params(Params& p, const ModelConfig& c, const std::string& m) {
  const int64_t d = c.hidden_size, E = c.n_routed_experts, h = c.moe_intermediate_size, Lt = c.latent_moe_dim;
  const int64_t in = Lt > 0 ? Lt : d;  // the width the experts run in
  p.add(router, m + hf::kRouter, {E, d});
  if (Lt > 0) {
    p.add(ldown, m + hf::kLatentDown, {Lt, d});
    p.add(lup, m + hf::kLatentUp, {d, Lt});
  }
  eg.assign(static_cast<size_t>(E), -1);
  eu.assign(static_cast<size_t>(E), -1);
  ed.assign(static_cast<size_t>(E), -1);
  for (size_t e = 0; e < eg.size(); ++e) {
    const std::string x = m + hf::expert(static_cast<int64_t>(e));
    p.add(eg[e], x + hf::kGateProj, {h, in}, true);
    p.add(eu[e], x + hf::kUpProj, {h, in}, true);
    p.add(ed[e], x + hf::kDownProj, {in, h}, true);
  }
  if (const int64_t s = c.shared_expert_intermediate_size; s > 0) {
    p.add(sh_g, m + hf::shared_expert(hf::kGateProj), {s, d});
    p.add(sh_u, m + hf::shared_expert(hf::kUpProj), {s, d});
    p.add(sh_d, m + hf::shared_expert(hf::kDownProj), {d, s});
  }
}

double MoeUnit::gemm_weights_per_token(const ModelConfig& c) {
  const double d = static_cast<double>(c.hidden_size), Lt = static_cast<double>(c.latent_moe_dim);
  return d * static_cast<double>(c.n_routed_experts) + (c.latent_moe_dim > 0 ? 2 * d * Lt : 0.0) +
         3 * d * static_cast<double>(c.shared_expert_intermediate_size);
}

double MoeUnit::gemm_weights_per_routed(const ModelConfig& c) {
  const double Lt = static_cast<double>(c.latent_moe_dim > 0 ? c.latent_moe_dim : c.hidden_size);
  return 3 * Lt * static_cast<double>(c.moe_intermediate_size);
}

int64_t MoeUnit::saved_floats_per_token(const ModelConfig& c) {
  return c.n_routed_experts + 1 + 3 * c.num_experts_per_tok + 2 * c.latent_moe_dim +
         3 * c.shared_expert_intermediate_size;
}

template <typename T>
moe::MoeStats MoeUnit::forward(const Ctx<T>& ctx, const T* x, T* f, Saved<T>& s) const {
  moe_weights(*this, ctx, s.w);
  return moe::moe_forward(moe_dims(ctx), s.w, x, ctx.valid, ctx.N, f, s.cache);
}

template <typename T>
void MoeUnit::backward(const Ctx<T>& ctx, const T* x, const Saved<T>& s, const T* df, T* dx) const {
  moe_weights(*this, ctx, s.w);  // the residency hooks may have moved the weights since the forward
  moe_grads(*this, ctx, s.g);
  moe::moe_backward(moe_dims(ctx), s.w, s.g, x, s.cache, df, ctx.aux_scale * ctx.loss->weight[kLossMoeLb],
                    ctx.aux_scale * ctx.loss->weight[kLossRouterZ], dx);
}

// ---- XLA: the latent MoE in dense form (unit_ffn.h) ------------------------------------------------------

namespace {

using xla::Compare;
using xla::ElementType;
using xla::TensorType;
using xla::Value;

// The routed weights' factor: weight_mult * k (moe_dims).
double moe_weight_scale(const ModelConfig& c) {
  double m = 1.0;
  if (c.original_num_experts_per_tok && *c.original_num_experts_per_tok != c.num_experts_per_tok)
    m = std::sqrt(static_cast<double>(*c.original_num_experts_per_tok) /
                  static_cast<double>(c.num_experts_per_tok));
  return m * static_cast<double>(c.num_experts_per_tok);
}

// [N] -> [N, E] (each row its token's value), or [E] -> [N, E] (each row the same).
Value rows(Emit& e, const Value& v, int64_t E) { return e.b.broadcast_in_dim(v, {e.N, E}, {0}); }
Value cols(Emit& e, const Value& v) { return e.b.broadcast_in_dim(v, {e.N, v.type().dims[0]}, {1}); }
Value f32(xla::HloBuilder& b, double v) { return b.scalar(ElementType::kF32, v); }

// The top-k mask [N, E] of P (1 = selected) by K rounds of argmax; ties go to the lower expert index (the
// kernel's partial_sort order). No sort op: each round takes the row max, the first index that holds it
// (max over E - index of the hits), and masks it out (p >= 0, so -1 is below every candidate).
// Also the chosen experts IDX s32 [N, k] in the rounds' order (descending p, as the kernel's topk).
struct TopK {
  Value sel, idx;
};
TopK topk_mask(Emit& e, const Value& p, int64_t E, int64_t k) {
  auto& b = e.b;
  const TensorType ti{ElementType::kS32, {e.N, E}};
  const Value rev = b.sub(b.constant(ti, static_cast<double>(E)), b.iota(ti, 1));  // E - e
  const Value zero_i = b.constant(ti, 0), one = b.constant(p.type(), 1), below = b.constant(p.type(), -1);
  Value work = p, sel = b.constant(p.type(), 0);
  std::vector<Value> idx;
  for (int64_t j = 0; j < k; ++j) {
    const Value hit = b.compare(work, rows(e, b.reduce_max(work, {1}), E), Compare::kEq);
    const Value first = b.reduce_max(b.select(hit, rev, zero_i), {1});  // E - the first hit's index
    const Value pick = b.compare(rev, rows(e, first, E), Compare::kEq);
    sel = b.select(pick, one, sel);
    work = b.select(pick, below, work);
    idx.push_back(b.reshape(b.sub(b.constant(first.type(), double(E)), first), {e.N, 1}));
  }
  return {sel, b.concatenate(idx, 1)};
}

// With a capacity over a mesh of several devices the experts split over the devices (moe_mesh_emit.h).
bool experts_over_mesh(const Emit& e) {
  return moe_emit::experts_over_mesh(e.mesh, e.loss.moe_buffer_factor);
}

// Router softmax, top-k, routing weights and the layer's statistics (moe_forward's router half).
void emit_router(Emit& e, const MoeUnit& u, const Value& x, MoeUnit::Emitted& s) {
  auto& b = e.b;
  const ModelConfig& c = e.c;
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
  const Value seg = b.reshape(*e.seg, {e.N});
  const Value valid = b.convert(b.compare(seg, b.constant(seg.type(), 0), Compare::kGe), ElementType::kF32);
  // the router in f32 always (the kernel's Precision::Exact), on the full-width x
  const Value logits = xla::ops::linear_forward(b, x, e.W(u.router));
  const Value m = b.reduce_max(logits, {1});
  const Value lse = b.add(m, b.log(b.reduce_sum(b.exp(b.sub(logits, rows(e, m, E))), {1})));
  const Value p = b.mul(b.exp(b.sub(logits, rows(e, lse, E))), rows(e, valid, E));
  const TopK top = topk_mask(e, p, E, k);
  const Value sel = b.mul(top.sel, rows(e, valid, E));
  s.idx = top.idx;
  const Value ps = b.mul(p, sel);
  // the sum of the selected p; 1 on padding rows (no selection there) so that nothing divides by 0
  const Value ssum = b.add(b.reduce_sum(ps, {1}), b.sub(b.constant(valid.type(), 1), valid));
  s.valid = valid, s.p = p, s.lse = lse, s.sel = sel, s.ssum = ssum;
  s.wts = b.mul(b.constant(ps.type(), moe_weight_scale(c)), b.div(ps, rows(e, ssum, E)));
  // LB = (E/k) sum_e c_e sum_t p_te / N_r^2,  Z = sum_t lse_t^2 / N_r,  rbf = max_e c_e / (N_r k / E)
  const Value loads = b.reduce_sum(sel, {0});
  const Value nr = b.max(b.reduce_sum(valid, {0}), f32(b, 1));
  s.loads = loads, s.nr = nr;
  const Value lb =
      b.div(b.mul(f32(b, double(E) / double(k)), b.reduce_sum(b.mul(loads, b.reduce_sum(p, {0})), {0})),
            b.mul(nr, nr));
  const Value rz = b.div(b.reduce_sum(b.mul(valid, b.mul(lse, lse)), {0}), nr);
  const Value rbf = b.div(b.reduce_max(loads, {0}), b.mul(nr, f32(b, double(k) / double(E))));
  // dropped assignments: 0 dropless; with a capacity moe_emit::dispatch's count (MoeUnit::emit_forward)
  Value dropped = f32(b, 0);
  if (experts_over_mesh(e)) {
    s.cap = moe_emit::capacity(b, nr, E, k, e.loss.moe_buffer_factor);
    dropped = moe_emit::dropped_over(b, loads, *s.cap);
  } else if (e.loss.moe_buffer_factor > 0) {
    s.disp = moe_emit::dispatch(b, top.idx, sel, *s.wts, valid, nr, e.loss.moe_buffer_factor);
    dropped = s.disp->dropped;
  }
  e.moe_stats.push_back(b.concatenate(
      {b.reshape(lb, {1}), b.reshape(rz, {1}), b.reshape(rbf, {1}), b.reshape(dropped, {1})}, 0));
}

// The experts' weights as the program holds them (model/xla_params.h: one stack per projection, the stacks
// read through W(eg[0]) / W(eu[0]) / W(ed[0])): gate, up [E, F, Lt], down [E, Lt, F]. Over a mesh that
// splits parameters the dense form gathers the stacks where used, as the other weights (decoder_xla.cpp);
// the capacity form reads each device's experts in place (moe_mesh_emit.h).
moe_emit::Experts stacked_experts(Emit& e, const MoeUnit& m) {
  if (experts_over_mesh(e)) return {e.W(m.eg[0]), e.W(m.eu[0]), e.W(m.ed[0])};
  auto use = [&](int idx) {
    const Value& w = e.W(idx);
    return e.mesh != nullptr && e.mesh->param_shards() > 1 ? e.b.constrain(w, xla::sharding_replicated()) : w;
  };
  return {use(m.eg[0]), use(m.eu[0]), use(m.ed[0])};
}

// The dense form's weights: gate / up [E*F, Lt] (rows e*F..), down [Lt, E*F] (columns e*F..).
struct Stacked {
  Value g, u, d;
};
Stacked dense_weights(Emit& e, const moe_emit::Experts& w) {
  const std::vector<int64_t>& g = w.g.type().dims;  // [E, F, Lt]
  const int64_t E = g[0], F = g[1], Lt = g[2];
  return {e.b.reshape(w.g, {E * F, Lt}), e.b.reshape(w.u, {E * F, Lt}),
          e.b.reshape(e.b.transpose(w.d, {1, 0, 2}), {Lt, E * F})};
}

// The routing weights [N, E] spread over each expert's F hidden columns: [N, E*F].
Value spread(Emit& e, const Value& w, int64_t E, int64_t F) {
  return e.b.reshape(e.b.broadcast_in_dim(w, {e.N, E, F}, {0, 1}), {e.N, E * F});
}

SwiGluUnit shared_unit(const MoeUnit& u, const ModelConfig& c) {
  SwiGluUnit s;
  s.gate = u.sh_g, s.up = u.sh_u, s.down = u.sh_d;
  s.hidden = c.shared_expert_intermediate_size;
  return s;
}

// The routed experts' backward from DR = dL/d(routed output) [N, Lt]: the experts' weight gradients (added to
// e), dz [N, Lt] and the routing weights' gradient dw [N, E].
struct ExpertGrads {
  Value dz, dw;
};
// Dense: r = (H * W) D^T with H = swiglu(A, B), recomputed.
ExpertGrads dense_backward(Emit& e, const MoeUnit& u, const MoeUnit::Emitted& s, const moe_emit::Experts& we,
                           const Value& dr) {
  namespace ops = xla::ops;
  auto& b = e.b;
  const int64_t E = e.c.n_routed_experts, F = e.c.moe_intermediate_size, Lt = s.z->type().dims[1];
  const Stacked w = dense_weights(e, we);
  const Value h = ops::swiglu_forward(b, *s.a, *s.b), wf = spread(e, *s.wts, E, F);
  const ops::LinearBackward ld = ops::linear_backward(b, dr, b.mul(h, wf), w.d, e.operands);
  const Value dw = b.reduce_sum(b.reshape(b.mul(ld.dx, h), {e.N, E, F}), {2});  // d routing weight [N, E]
  const ops::SwigluBackward sb = ops::swiglu_backward(b, b.mul(ld.dx, wf), *s.a, *s.b);
  const ops::LinearBackward lg = ops::linear_backward(b, sb.da, *s.z, w.g, e.operands);
  const ops::LinearBackward lu = ops::linear_backward(b, sb.db, *s.z, w.u, e.operands);
  e.grad(u.eg[0], b.reshape(lg.dw, {E, F, Lt}));  // the stacks' gradients (xla_params.h)
  e.grad(u.eu[0], b.reshape(lu.dw, {E, F, Lt}));
  e.grad(u.ed[0], b.transpose(b.reshape(ld.dw, {Lt, E, F}), {1, 0, 2}));
  return {b.add(lg.dx, lu.dx), dw};
}
// With a capacity: the buffers again from z, the batched backward (moe_capacity_emit.h).
// The stacks' gradients of G added to e (xla_params.h), its dz and dw returned.
ExpertGrads expert_grads(Emit& e, const MoeUnit& u, const moe_emit::ExpertsBackward& g) {
  e.grad(u.eg[0], g.dg);
  e.grad(u.eu[0], g.du);
  e.grad(u.ed[0], g.dd);
  return {g.dz, g.dw};
}
ExpertGrads capacity_backward(Emit& e, const MoeUnit& u, const MoeUnit::Emitted& s,
                              const moe_emit::Experts& we, const Value& dr) {
  auto& b = e.b;
  return expert_grads(e, u,
                      moe_emit::experts_backward(b, *s.disp, we, moe_emit::to_buffers(b, *s.disp, *s.z),
                                                 {*s.a, *s.b}, dr, e.operands));
}

// Over a mesh: the region's inputs (moe_mesh_emit.h).
moe_emit::MeshRouted mesh_routed(const Emit& e, const MoeUnit::Emitted& s) {
  return {*e.mesh, e.B, e.T, e.loss.moe_buffer_factor, e.operands, *s.z, *s.idx, *s.valid, *s.wts, *s.cap};
}
ExpertGrads mesh_backward(Emit& e, const MoeUnit& u, const MoeUnit::Emitted& s, const moe_emit::Experts& we,
                          const Value& dr) {
  return expert_grads(e, u, moe_emit::mesh_backward(e.b, mesh_routed(e, s), we, *s.a, *s.b, dr));
}

}  // namespace

xla::Value MoeUnit::emit_forward(Emit& e, const xla::Value& x, Emitted& s) const {
  namespace ops = xla::ops;
  auto& b = e.b;
  const ModelConfig& c = e.c;
  const int64_t E = c.n_routed_experts, F = c.moe_intermediate_size;
  emit_router(e, *this, x, s);
  const Value z = ldown >= 0 ? ops::linear_forward(b, x, e.W(ldown), e.operands) : x;
  s.z = z;
  const moe_emit::Experts we = stacked_experts(e, *this);
  if (s.cap) {  // with a capacity over the mesh: each device its experts (moe_mesh_emit.h)
    const moe_emit::MeshForward f = moe_emit::mesh_forward(b, mesh_routed(e, s), we);
    s.a = f.a, s.b = f.b, s.r = f.r;
  } else if (s.disp) {  // with a capacity: each expert on its kept assignments (moe_capacity_emit.h)
    const moe_emit::ExpertsForward f =
        moe_emit::experts_forward(b, we, moe_emit::to_buffers(b, *s.disp, z), e.operands);
    s.a = f.a, s.b = f.b;
    s.r = moe_emit::combine(b, *s.disp,
                            moe_emit::experts_down(b, we, ops::swiglu_forward(b, f.a, f.b), e.operands));
  } else {  // dense experts: every expert on every token, weighted by the routing weight (0 when not
            // selected)
    const Stacked w = dense_weights(e, we);
    s.a = ops::linear_forward(b, z, w.g, e.operands);
    s.b = ops::linear_forward(b, z, w.u, e.operands);
    const Value hw = b.mul(ops::swiglu_forward(b, *s.a, *s.b), spread(e, *s.wts, E, F));
    s.r = ops::linear_forward(b, hw, w.d, e.operands);
  }
  Value out = lup >= 0 ? ops::linear_forward(b, *s.r, e.W(lup), e.operands) : *s.r;
  if (sh_g >= 0) out = b.add(out, shared_unit(*this, c).emit_forward(e, x, s.shared));
  return out;
}

xla::Value MoeUnit::emit_backward(Emit& e, const xla::Value& x, const Emitted& s,
                                  const xla::Value& df) const {
  namespace ops = xla::ops;
  auto& b = e.b;
  const ModelConfig& c = e.c;
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok;
  OLMO_CHECK(e.aux_scale.has_value(), c.model_type_name, ": the MoE backward needs Emit::aux_scale");
  Value dx = sh_g >= 0 ? shared_unit(*this, c).emit_backward(e, x, s.shared, df) : b.constant(x.type(), 0);
  Value dr = df;
  if (lup >= 0) {
    const ops::LinearBackward l = ops::linear_backward(b, df, *s.r, e.W(lup), e.operands);
    e.grad(lup, l.dw);
    dr = l.dx;
  }
  const moe_emit::Experts w = stacked_experts(e, *this);
  const ExpertGrads xg = s.cap    ? mesh_backward(e, *this, s, w, dr)
                         : s.disp ? capacity_backward(e, *this, s, w, dr)
                                  : dense_backward(e, *this, s, w, dr);
  const Value dw = xg.dw, dz = xg.dz;
  if (ldown >= 0) {
    const ops::LinearBackward l = ops::linear_backward(b, dz, x, e.W(ldown), e.operands);
    e.grad(ldown, l.dw);
    dx = b.add(dx, l.dx);
  } else {
    dx = b.add(dx, dz);
  }
  // Router (moe_backward): through the selected p's L1 normalisation, the load-balance and the z-loss.
  const Value lb_coef = b.mul(*e.aux_scale, f32(b, e.loss.weight[kLossMoeLb]));
  const Value z_coef = b.mul(*e.aux_scale, f32(b, e.loss.weight[kLossRouterZ]));
  const Value nr2 = b.mul(*s.nr, *s.nr);
  const Value lbg =
      b.mul(b.broadcast_in_dim(b.div(b.mul(lb_coef, f32(b, double(E) / double(k))), nr2), {E}, {}),
            *s.loads);  // [E]
  const Value dwm = b.mul(dw, *s.sel), ss = rows(e, *s.ssum, E);
  const Value dws = rows(e, b.reduce_sum(b.mul(dwm, *s.p), {1}), E);
  const Value route = b.mul(b.mul(b.constant(s.sel->type(), moe_weight_scale(c)), *s.sel),
                            b.sub(b.div(dwm, ss), b.div(dws, b.mul(ss, ss))));
  const Value dp = b.add(b.mul(cols(e, lbg), rows(e, *s.valid, E)), route);
  const Value dot = b.reduce_sum(b.mul(dp, *s.p), {1});
  const Value zc = b.div(b.mul(b.broadcast_in_dim(b.mul(z_coef, f32(b, 2)), {e.N}, {}), *s.lse),
                         b.broadcast_in_dim(*s.nr, {e.N}, {}));
  const Value dlog = b.mul(*s.p, b.add(b.sub(dp, rows(e, dot, E)), rows(e, zc, E)));
  const ops::LinearBackward lr = ops::linear_backward(b, dlog, x, e.W(router));
  e.grad(router, lr.dw);
  return b.add(dx, lr.dx);
}

#define OLMOSFT_FFN_UNITS(T)                                                                            \
  template void SwiGluUnit::forward<T>(const Ctx<T>&, const T*, T*, const Saved<T>&, const Scratch<T>&) \
      const;                                                                                            \
  template void SwiGluUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, const T*, T*,         \
                                        const Scratch<T>&) const;                                       \
  template moe::MoeStats MoeUnit::forward<T>(const Ctx<T>&, const T*, T*, Saved<T>&) const;             \
  template void MoeUnit::backward<T>(const Ctx<T>&, const T*, const Saved<T>&, const T*, T*) const;
OLMOSFT_FFN_UNITS(float)
OLMOSFT_FFN_UNITS(double)
#undef OLMOSFT_FFN_UNITS

}  // namespace olmosft::model::unit
