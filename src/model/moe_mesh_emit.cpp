// The latent MoE's experts with a capacity over a device mesh, as StableHLO (moe_mesh_emit.h).
#include "model/moe_mesh_emit.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace olmosft::model::unit::moe_emit {

namespace {
constexpr xla::ElementType kF32 = xla::ElementType::kF32;
constexpr xla::ElementType kS32 = xla::ElementType::kS32;
using xla::Compare;
using xla::Logical;
using xla::TensorType;

// The shapes of one layer's region: D devices of El experts each; N tokens, n per device, laid out as the
// mesh's blocked order [R, C, Bt, Tp] (R row groups of Bt rows, C pieces of Tp tokens) of the batch's
// row-major [R * Bt, C * Tp].
struct Geometry {
  xla::Mesh mesh;
  int64_t D, El, N, n, k, E, Lt, F, Cb, R, C, Bt, Tp;
  HloBuilder::DeviceGroups all;  // one group: every device, in order (the blocked order's tiles)

  Geometry(const MeshRouted& in, const Experts& w) : mesh(in.mesh) {
    const xla::Mesh& m = in.mesh;
    D = m.devices(), N = in.idx.type().dims[0], k = in.idx.type().dims[1], E = w.g.type().dims[0];
    F = w.g.type().dims[1], Lt = w.g.type().dims[2];
    check_mesh_experts(m, E, N);
    El = E / D, n = N / D, Cb = buffer_rows(N, E, k, in.bf);
    R = m.batch_shards(), C = m.seq_shards();
    Bt = in.B / C / R, Tp = in.T;  // row tiles [B0 * C, T0 / C]: B0 = B / C rows of T0 = T * C tokens
    OLMO_CHECK(Bt * R * Tp * C == N, "moe experts over the mesh: rows ", in.B, " x ", in.T, " are not ", N,
               " tokens over mesh ", m.text());
    all.assign(1, {});
    for (int64_t d = 0; d < D; ++d) all[0].push_back(d);
  }
  // A token array [N, ...] in the blocked order, reordered into the batch's row-major order.
  Value row_major(HloBuilder& b, const Value& x) const {
    std::vector<int64_t> dims{R, C, Bt, Tp}, perm{0, 2, 1, 3}, out{N};
    for (size_t i = 1; i < x.type().dims.size(); ++i) {
      dims.push_back(x.type().dims[i]);
      perm.push_back(int64_t(perm.size()));
      out.push_back(x.type().dims[i]);
    }
    return b.reshape(b.transpose(b.reshape(x, dims), perm), out);
  }
  // The region's view of the global arrays: tokens split on dim 0 over every device, experts and their
  // buffers split on E, a scalar broadcast to one value per device.
  std::string tokens(const std::vector<int64_t>& dims) const {
    return xla::dim_sharding(mesh, dims, 0, Logical::kTokens, "moe experts' tokens");
  }
  std::string experts(const std::vector<int64_t>& dims) const {
    return xla::dim_sharding(mesh, dims, 0, Logical::kParam, "moe experts");
  }
  Value local(HloBuilder& b, const Value& x, bool expert_dim) const {
    TensorType t = x.type();
    t.dims[0] /= D;
    return b.full_to_shard(x, expert_dim ? experts(x.type().dims) : tokens(x.type().dims), t);
  }
  Value global(HloBuilder& b, const Value& x, bool expert_dim) const {
    TensorType t = x.type();
    t.dims[0] *= D;
    return b.shard_to_full(x, expert_dim ? experts(t.dims) : tokens(t.dims), t);
  }
};

Value full(HloBuilder& b, xla::ElementType t, const std::vector<int64_t>& dims, double v) {
  return b.constant(TensorType{t, dims}, v);
}

// Device-local arguments of the region, in this order (then the caller's extras).
enum Arg { kZ, kIdx, kValid, kWts, kCap, kId, kG, kU, kD, kExtra };
std::vector<Value> region_args(HloBuilder& b, const Geometry& g, const MeshRouted& in, const Experts& w) {
  const Value ids = b.iota({kS32, {g.D}}, 0);
  const Value caps = b.broadcast_in_dim(in.cap, {g.D}, {});
  return {g.local(b, in.z, false),   g.local(b, in.idx, false), g.local(b, in.valid, false),
          g.local(b, in.wts, false), g.local(b, caps, false),   g.local(b, ids, false),
          g.local(b, w.g, true),     g.local(b, w.u, true),     g.local(b, w.d, true)};
}

// This device's slots: El * Cb rows of its buffers, each holding one kept assignment or empty.
struct Slots {
  Value filled;  // pred [El * Cb]
  Value fill_f;  // f32 [El * Cb] 1 = filled
  Value asg;     // s32 [El * Cb] the assignment's index n * k + j in the blocked order (N * k: empty)
  Value tok;     // s32 [El * Cb] its token n in the blocked order (N: empty)
  Value w;       // f32 [El * Cb] its routing weight (0: empty)
};

// pos[n, e] = Σ_{n' < n in row-major order} sel[n', e] over this device's experts e (exclusive, exact in
// s32); kept = valid and pos < capacity (as moe_emit::dispatch); slot e * Cb + pos <- the assignment.
Slots route(HloBuilder& b, const Geometry& g, const std::vector<Value>& a) {
  const int64_t N = g.N, k = g.k, El = g.El, n = g.n, Nk = N * k;
  const TensorType lk{kS32, {n, k}};
  const Value fid_l = b.reshape(b.add(b.mul(b.iota(lk, 0), b.constant(lk, double(g.E))), a[kIdx]), {n * k});
  const Value wpick = b.all_gather(b.gather_rows(b.reshape(a[kWts], {n * g.E}), fid_l), 0, g.all);  // [Nk]
  const Value idx = g.row_major(b, b.all_gather(a[kIdx], 0, g.all));                                // [N, k]
  const Value valid = g.row_major(b, b.all_gather(a[kValid], 0, g.all));                            // [N]
  const Value blk = g.row_major(b, b.iota({kS32, {N}}, 0));  // each row-major token's blocked index
  const Value e0 = b.mul(b.reshape(a[kId], {}), b.scalar(kS32, double(El)));
  const Value local = b.sub(idx, b.broadcast_in_dim(e0, {N, k}, {}));
  const Value own = b.mul(b.convert(b.compare(local, full(b, kS32, {N, k}, 0), Compare::kGe), kS32),
                          b.convert(b.compare(local, full(b, kS32, {N, k}, double(El)), Compare::kLt), kS32));
  const Value vi = b.convert(valid, kS32);
  const Value hit = b.convert(
      b.compare(b.broadcast_in_dim(local, {N, k, El}, {0, 1}), b.iota({kS32, {N, k, El}}, 2), Compare::kEq),
      kS32);
  const Value sel = b.mul(b.reduce_sum(hit, {1}), b.broadcast_in_dim(vi, {N, El}, {0}));  // [N, El]
  const Value pos = b.sub(b.cumsum(sel, 0), sel);
  const Value lc = b.max(b.min(local, full(b, kS32, {N, k}, double(El - 1))), full(b, kS32, {N, k}, 0));
  const TensorType nk{kS32, {N, k}};
  const Value at = b.reshape(b.add(b.mul(b.iota(nk, 0), b.constant(nk, double(El))), lc), {Nk});
  const Value p = b.gather_rows(b.reshape(pos, {N * El}), at);  // [Nk]
  const Value ok = b.mul(
      b.reshape(b.mul(own, b.broadcast_in_dim(vi, {N, k}, {0})), {Nk}),
      b.convert(
          b.compare(b.convert(p, kF32), b.broadcast_in_dim(b.reshape(a[kCap], {}), {Nk}, {}), Compare::kLt),
          kS32));
  const Value on = b.compare(ok, full(b, kS32, {Nk}, 0), Compare::kGt);
  const Value dest = b.select(on, b.add(b.mul(b.reshape(lc, {Nk}), full(b, kS32, {Nk}, double(g.Cb))), p),
                              full(b, kS32, {Nk}, double(El * g.Cb)));
  const Value basg = b.reshape(
      b.add(b.mul(b.broadcast_in_dim(blk, {N, k}, {0}), b.constant(nk, double(k))), b.iota(nk, 1)), {Nk});
  // each slot receives at most one assignment: its index + 1 onto 0 (0 stays: empty)
  const Value map =
      b.scatter_add_rows(full(b, kS32, {El * g.Cb}, 0), dest, b.add(basg, full(b, kS32, {Nk}, 1)));
  const int64_t S = El * g.Cb;
  const Value filled = b.compare(map, full(b, kS32, {S}, 0), Compare::kGt);
  const Value fill_f = b.select(filled, full(b, kF32, {S}, 1), full(b, kF32, {S}, 0));
  const Value asg = b.max(b.sub(map, full(b, kS32, {S}, 1)), full(b, kS32, {S}, 0));
  return Slots{filled, fill_f, b.select(filled, asg, full(b, kS32, {S}, double(Nk))),
               b.select(filled, b.div(asg, full(b, kS32, {S}, double(k))), full(b, kS32, {S}, double(N))),
               b.mul(b.gather_rows(wpick, asg), fill_f)};
}

// Rows of X [N, W] at the slots' tokens, zero in empty slots: [El * Cb, W].
Value slot_rows(HloBuilder& b, const Slots& s, const Value& x) {
  const int64_t S = s.tok.type().dims[0], W = x.type().dims[1];
  const Value rows = b.gather_rows(x, s.tok);  // an empty slot's N clamps to a real row, then zeroed
  return b.select(b.broadcast_in_dim(s.filled, {S, W}, {0}), rows, b.constant(rows.type(), 0));
}
// The slots' rows Y [El * Cb, W] summed into their tokens [N, W] and left on the tokens' own devices.
Value to_tokens(HloBuilder& b, const Geometry& g, const Slots& s, const Value& y) {
  const int64_t W = y.type().dims[1];
  return b.reduce_scatter(b.scatter_add_rows(full(b, kF32, {g.N, W}, 0), s.tok, y), 0, g.all);
}
Value buffers(HloBuilder& b, const Geometry& g, const Slots& s, const std::vector<Value>& a,
              xla::ops::Operands o) {
  const Value z = b.all_gather(xla::ops::operand(b, a[kZ], o), 0, g.all);
  return b.reshape(slot_rows(b, s, z), {g.El, g.Cb, g.Lt});
}
}  // namespace

bool experts_over_mesh(const xla::Mesh* mesh, double bf) {
  return bf > 0 && mesh != nullptr && mesh->devices() > 1;
}

void check_mesh_experts(const xla::Mesh& mesh, int64_t E, int64_t N) {
  OLMO_CHECK(mesh.data == 1, "moe.buffer_factor > 0 over mesh ", mesh.text(),
             ": experts over the mesh keep the micro-batch's one queue per expert, which data replicas "
             "would split; use fsdp instead of data (the same memory for the parameters, split)");
  OLMO_CHECK(E % mesh.devices() == 0, "moe.buffer_factor > 0 over mesh ", mesh.text(), ": ", E,
             " routed experts must split evenly over its ", mesh.devices(), " devices");
  OLMO_CHECK(N % mesh.devices() == 0, "moe experts over mesh ", mesh.text(), ": ", N,
             " tokens do not split over its ", mesh.devices(), " devices");  // N 0: not known yet
}

MeshForward mesh_forward(HloBuilder& b, const MeshRouted& in, const Experts& w) {
  const Geometry g(in, w);
  const xla::ops::Operands o = in.o;
  const auto res = b.call(
      "moe_experts_forward", region_args(b, g, in, w), [&](HloBuilder& b, const std::vector<Value>& a) {
        const Slots s = route(b, g, a);
        const Experts wl{a[kG], a[kU], a[kD]};
        const ExpertsForward f = experts_forward(b, wl, buffers(b, g, s, a, o), o);
        const Value y = experts_down(b, wl, xla::ops::swiglu_forward(b, f.a, f.b), o);
        const Value yw =
            b.mul(b.reshape(y, {g.El * g.Cb, g.Lt}), b.broadcast_in_dim(s.w, {g.El * g.Cb, g.Lt}, {0}));
        return std::vector<Value>{to_tokens(b, g, s, yw), f.a, f.b};
      });
  return {g.global(b, res[0], false), g.global(b, res[1], true), g.global(b, res[2], true)};
}

// r_n = Σ_j w_nj Y[slot_nj]: dY[slot] = w dr_n, dw[slot] = dr_n . Y[slot] (moe_emit::experts_backward's
// formulas on this device's slots); dz_n = Σ_j dX[slot_nj], summed over the devices holding n's slots.
ExpertsBackward mesh_backward(HloBuilder& b, const MeshRouted& in, const Experts& w, const Value& a,
                              const Value& bb, const Value& dr) {
  const Geometry g(in, w);
  const xla::ops::Operands o = in.o;
  std::vector<Value> args = region_args(b, g, in, w);
  args.push_back(g.local(b, a, true));
  args.push_back(g.local(b, bb, true));
  args.push_back(g.local(b, dr, false));
  const auto res = b.call("moe_experts_backward", args, [&](HloBuilder& b, const std::vector<Value>& r) {
    const int64_t S = g.El * g.Cb;
    const Slots s = route(b, g, r);
    const Experts wl{r[kG], r[kU], r[kD]};
    const Value x = buffers(b, g, s, r, o);
    const Value &fa = r[kExtra], &fb = r[kExtra + 1];
    const Value drs = slot_rows(b, s, b.all_gather(r[kExtra + 2], 0, g.all));  // [S, Lt] f32
    const Value h = xla::ops::swiglu_forward(b, fa, fb);
    const Value y = b.reshape(experts_down(b, wl, h, o), {S, g.Lt});
    const Value dws = b.mul(b.reduce_sum(b.mul(drs, y), {1}), s.fill_f);  // [S]
    const Value dy = b.reshape(b.mul(drs, b.broadcast_in_dim(s.w, {S, g.Lt}, {0})), {g.El, g.Cb, g.Lt});
    auto bmm = [&](const Value& p, const Value& q, const xla::DotDims& d) {
      return b.dot_general(xla::ops::operand(b, p, o), xla::ops::operand(b, q, o), d, kF32);
    };
    const Value dh = bmm(dy, wl.d, {{0}, {0}, {2}, {1}});  // [El, Cb, Lt] . [El, Lt, F]
    const xla::ops::SwigluBackward sb = xla::ops::swiglu_backward(b, dh, fa, fb);
    const xla::DotDims over_rows{{0}, {0}, {1}, {1}}, back{{0}, {0}, {2}, {1}};
    const Value dx = b.add(bmm(sb.da, wl.g, back), bmm(sb.db, wl.u, back));  // [El, Cb, Lt]
    const Value dz = to_tokens(b, g, s, b.reshape(dx, {S, g.Lt}));
    const Value dwk =
        b.reduce_scatter(b.scatter_add_rows(full(b, kF32, {g.N * g.k}, 0), s.asg, dws), 0, g.all);  // [n * k]
    const TensorType lk{kS32, {g.n, g.k}};
    const Value fid =
        b.reshape(b.add(b.mul(b.iota(lk, 0), b.constant(lk, double(g.E))), r[kIdx]), {g.n * g.k});
    const Value dw = b.reshape(b.scatter_add_rows(full(b, kF32, {g.n * g.E}, 0), fid, dwk), {g.n, g.E});
    return std::vector<Value>{dz, dw, bmm(sb.da, x, over_rows), bmm(sb.db, x, over_rows),
                              bmm(dy, h, over_rows)};
  });
  return {g.global(b, res[0], false), g.global(b, res[1], false), g.global(b, res[2], true),
          g.global(b, res[3], true), g.global(b, res[4], true)};
}

}  // namespace olmosft::model::unit::moe_emit
