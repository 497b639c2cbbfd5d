// The latent MoE's experts with a capacity, as StableHLO (moe_capacity_emit.h).
#include "model/moe_capacity_emit.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace olmosft::model::unit::moe_emit {

namespace {
constexpr xla::ElementType kF32 = xla::ElementType::kF32;
constexpr xla::ElementType kS32 = xla::ElementType::kS32;

// A batched product in f32 (bf16 operands when O says so).
Value bmm(HloBuilder& b, const Value& x, const Value& y, const xla::DotDims& d, xla::ops::Operands o) {
  return b.dot_general(xla::ops::operand(b, x, o), xla::ops::operand(b, y, o), d, kF32);
}
// [N * k, W] rows of the flat buffers Y [E, Cb, W] at the assignments' rows, 0 where not kept.
Value gather_kept(HloBuilder& b, const Dispatch& d, const Value& y) {
  const int64_t W = y.type().dims[2];
  const Value rows = b.gather_rows(b.reshape(y, {d.E * d.Cb, W}), d.src);
  return b.mul(rows, b.broadcast_in_dim(d.kept, {d.N * d.k, W}, {0}));
}
}  // namespace

int64_t buffer_rows(int64_t N, int64_t E, int64_t k, double bf) {
  OLMO_CHECK(bf > 0 && E >= 1 && k >= 1 && N >= 1, "moe capacity: buffer factor ", bf, " must be > 0");
  const double c = std::ceil(bf * double(N) * double(k) / double(E) - 1e-9);
  return std::max<int64_t>(1, std::min<int64_t>(N, int64_t(c)));  // a token picks an expert at most once
}

Value capacity(HloBuilder& b, const Value& nr, int64_t E, int64_t k, double bf) {
  return b.ceil(b.mul(nr, b.scalar(kF32, bf * double(k) / double(E))));
}

Value dropped_over(HloBuilder& b, const Value& loads, const Value& cap) {
  const Value over = b.sub(loads, b.broadcast_in_dim(cap, loads.type().dims, {}));
  return b.reduce_sum(b.max(over, b.constant(loads.type(), 0.0)), {0});
}

// pos[n, e] = Σ_{n' < n} sel[n', e] (exclusive, exact in s32);  capacity = ceil(bf k / E * N_r) (f32: the
// kernel's double value whenever bf k / E is a binary fraction, e.g. 2.5 * 16 / 512; otherwise an integer
// boundary may round to the next slot);  kept = valid and pos < capacity.
Dispatch dispatch(HloBuilder& b, const Value& idx, const Value& sel, const Value& wts, const Value& valid,
                  const Value& nr, double bf) {
  const int64_t N = idx.type().dims[0], k = idx.type().dims[1], E = sel.type().dims[1], Nk = N * k;
  const int64_t Cb = buffer_rows(N, E, k, bf);
  const Value si = b.convert(sel, kS32);
  const Value pos = b.sub(b.cumsum(si, 0), si);  // [N, E]
  const xla::TensorType nk{kS32, {N, k}};
  const Value fid = b.reshape(b.add(b.mul(b.iota(nk, 0), b.constant(nk, double(E))), idx), {Nk});
  const Value p = b.gather_rows(b.reshape(pos, {N * E}), fid);  // [N * k]
  const Value cap = capacity(b, nr, E, k, bf);
  const Value vk = b.reshape(b.broadcast_in_dim(valid, {N, k}, {0}), {Nk});
  const Value in_cap = b.compare(b.convert(p, kF32), b.broadcast_in_dim(cap, {Nk}, {}), xla::Compare::kLt);
  const Value keep = b.select(in_cap, vk, b.constant({kF32, {Nk}}, 0.0));
  const Value on = b.compare(keep, b.constant({kF32, {Nk}}, 0.5), xla::Compare::kGt);
  const Value row = b.add(b.mul(b.reshape(idx, {Nk}), b.constant({kS32, {Nk}}, double(Cb))), p);
  return {fid,
          b.select(on, row, b.constant({kS32, {Nk}}, double(E * Cb))),
          b.select(on, row, b.constant({kS32, {Nk}}, 0.0)),
          keep,
          b.mul(keep, b.gather_rows(b.reshape(wts, {N * E}), fid)),
          b.sub(b.reduce_sum(vk, {0}), b.reduce_sum(keep, {0})),
          E,
          k,
          N,
          Cb};
}

Value to_buffers(HloBuilder& b, const Dispatch& d, const Value& z) {
  const int64_t Lt = z.type().dims[1];
  const Value rows = b.reshape(b.broadcast_in_dim(z, {d.N, d.k, Lt}, {0, 2}), {d.N * d.k, Lt});
  const Value buf = b.scatter_add_rows(b.constant({kF32, {d.E * d.Cb, Lt}}, 0.0), d.dest, rows);
  return b.reshape(buf, {d.E, d.Cb, Lt});
}

ExpertsForward experts_forward(HloBuilder& b, const Experts& w, const Value& x, xla::ops::Operands o) {
  const xla::DotDims dd{{0}, {0}, {2}, {2}};  // [E, Cb, Lt] . [E, F, Lt] -> [E, Cb, F]
  return {bmm(b, x, w.g, dd, o), bmm(b, x, w.u, dd, o)};
}

Value experts_down(HloBuilder& b, const Experts& w, const Value& h, xla::ops::Operands o) {
  return bmm(b, h, w.d, {{0}, {0}, {2}, {2}}, o);  // [E, Cb, F] . [E, Lt, F] -> [E, Cb, Lt]
}

Value combine(HloBuilder& b, const Dispatch& d, const Value& y) {
  const int64_t Lt = y.type().dims[2];
  const Value r = b.mul(gather_kept(b, d, y), b.broadcast_in_dim(d.wk, {d.N * d.k, Lt}, {0}));
  return b.reduce_sum(b.reshape(r, {d.N, d.k, Lt}), {1});
}

// r_n = Σ_j w_nj Y[row_nj]:  dY[row_nj] = w_nj dr_n (a scatter of the kept rows);  dw_nj = dr_n . Y[row_nj];
// Y = H Wd^T, H = swiglu(A, B), A = X Wg^T, B = X Wu^T per expert;  dz_n = Σ_j dX[row_nj].
ExpertsBackward experts_backward(HloBuilder& b, const Dispatch& d, const Experts& w, const Value& x,
                                 const ExpertsForward& f, const Value& dr, xla::ops::Operands o) {
  const int64_t Lt = dr.type().dims[1], Nk = d.N * d.k;
  const Value drk = b.reshape(b.broadcast_in_dim(dr, {d.N, d.k, Lt}, {0, 2}), {Nk, Lt});
  const Value h = xla::ops::swiglu_forward(b, f.a, f.b);
  const Value y = experts_down(b, w, h, o);
  const Value dwk = b.mul(b.reduce_sum(b.mul(drk, gather_kept(b, d, y)), {1}), d.kept);
  const Value dy = b.reshape(b.scatter_add_rows(b.constant({kF32, {d.E * d.Cb, Lt}}, 0.0), d.dest,
                                                b.mul(drk, b.broadcast_in_dim(d.wk, {Nk, Lt}, {0}))),
                             {d.E, d.Cb, Lt});
  const Value dh = bmm(b, dy, w.d, {{0}, {0}, {2}, {1}}, o);  // [E, Cb, Lt] . [E, Lt, F] -> [E, Cb, F]
  const xla::ops::SwigluBackward sb = xla::ops::swiglu_backward(b, dh, f.a, f.b);
  const xla::DotDims over_rows{{0}, {0}, {1}, {1}};  // [E, Cb, P] . [E, Cb, Q] -> [E, P, Q]
  ExpertsBackward g{dr, dr, bmm(b, sb.da, x, over_rows, o), bmm(b, sb.db, x, over_rows, o),
                    bmm(b, dy, h, over_rows, o)};
  const xla::DotDims back{{0}, {0}, {2}, {1}};  // [E, Cb, F] . [E, F, Lt] -> [E, Cb, Lt]
  const Value dx = b.add(bmm(b, sb.da, w.g, back, o), bmm(b, sb.db, w.u, back, o));
  g.dz = b.reduce_sum(b.reshape(gather_kept(b, d, dx), {d.N, d.k, Lt}), {1});
  g.dw = b.reshape(b.scatter_add_rows(b.constant({kF32, {d.N * d.E}}, 0.0), d.fid, dwk), {d.N, d.E});
  return g;
}

}  // namespace olmosft::model::unit::moe_emit
