#include "xla/ops_xent.h"

#include <limits>

#include "xla/hlo_loops.h"
#include "xla/ops_util.h"

namespace olmosft::xla::ops {

using namespace detail;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Dims {
  int64_t N = 0, d = 0, Vr = 0, V = 0, C = 0, nc = 0;
};
struct Prep : Dims {
  Value trained;  // pred [N]
};

Prep prepare(HloBuilder& b, const Value& h, const Value& w, const Value& targets, const Value& mask,
             const XentOptions& o, const char* op) {
  expect_type(h, kF32, op, "h");
  expect_type(w, kF32, op, "W");
  expect_type(targets, kS32, op, "targets");
  expect_type(mask, kS32, op, "mask");
  OLMO_CHECK(h.type().rank() == 2 && w.type().rank() == 2 && w.type().dims[1] == h.type().dims[1],
             "xla ops: ", op, ": h [N, d] and W [V_rows, d] do not fit: ", h.type().mlir(), " and ",
             w.type().mlir());
  Dims p;
  p.N = h.type().dims[0];
  p.d = h.type().dims[1];
  p.Vr = w.type().dims[0];
  p.V = o.valid_vocab;
  expect_dims(targets, {p.N}, op, "targets");
  expect_dims(mask, {p.N}, op, "mask");
  OLMO_CHECK(p.V > 0 && p.V <= p.Vr && o.vocab_chunk >= 0, "xla ops: ", op, ": valid_vocab ", p.V,
             " must be in [1, V_rows = ", p.Vr, "] and vocab_chunk ", o.vocab_chunk, " >= 0");
  p.C = o.vocab_chunk == 0 ? p.V : std::min(o.vocab_chunk, p.V);
  p.nc = (p.V + p.C - 1) / p.C;
  const Value m = b.compare(mask, full(b, {p.N}, 0, kS32), Compare::kNe);
  const Value t = b.compare(targets, full(b, {p.N}, double(o.ignore_index), kS32), Compare::kNe);
  return Prep{p, b.select(m, t, full(b, {p.N}, 0, kPred))};
}

// Tile J covers vocabulary rows [J C, J C + C); the last one, when C does not divide valid_vocab, is read
// from valid_vocab - C (W is never copied or padded) and its columns below J C, counted by the tile before,
// are masked out.
struct Tile {
  Value start;   // s32 scalar: the first row of W read
  Value wc;      // [C, d]
  Value logits;  // [N, C]
  Value col;     // s32 [N, C]: the vocabulary index of each column
  Value valid;   // pred [N, C]: the column belongs to this tile
};
// HO: h as the product operand (operand(h)).
Tile tile(HloBuilder& b, const Prep& p, const Value& ho, const Value& w, const Value& j, Operands o) {
  const Value c0 = b.mul(j, b.scalar(kS32, double(p.C)));
  const Value start = b.min(c0, b.scalar(kS32, double(p.V - p.C)));
  const Value wc = b.dynamic_slice(w, {start, b.scalar(kS32, 0)}, {p.C, p.d});
  const std::vector<int64_t> nc{p.N, p.C};
  const Value col = b.add(b.iota({kS32, nc}, 1), bcast(b, start, nc, {}));
  return Tile{start, wc, b.dot_general(ho, operand(b, wc, o), {{}, {}, {1}, {1}}, kF32), col,
              b.compare(col, bcast(b, c0, nc, {}), Compare::kGe)};
}

}  // namespace

XentForward xent_forward(HloBuilder& b, const Value& h, const Value& w, const Value& targets,
                         const Value& mask, const XentOptions& o) {
  const Prep p = prepare(b, h, w, targets, mask, o, "xent_forward");
  const Value ho = operand(b, h, o.operands);
  const std::vector<int64_t> n{p.N}, nc{p.N, p.C};
  const std::vector<Value> init{full(b, n, kNegInf), full(b, n, 0.0), full(b, n, 0.0)};
  const auto fin = b.for_loop(
      p.nc, init,
      [&](HloBuilder& b, const Value& j, const std::vector<Value>& c) {
        const Tile t = tile(b, p, ho, w, j, o.operands);
        const Value zero = full(b, nc, 0.0);
        const Value m_new = b.max(c[0], b.reduce_max(b.select(t.valid, t.logits, full(b, nc, kNegInf)), {1}));
        const Value e = b.select(t.valid, b.exp(b.sub(t.logits, bcast(b, m_new, nc, {0}))), zero);
        const Value alpha = b.select(b.compare(c[0], full(b, n, kNegInf), Compare::kEq), full(b, n, 0.0),
                                     b.exp(b.sub(c[0], m_new)));
        const Value l = b.add(b.mul(c[1], alpha), b.reduce_sum(e, {1}));
        const Value is_t = b.select(t.valid, b.compare(t.col, bcast(b, targets, nc, {0}), Compare::kEq),
                                    full(b, nc, 0, kPred));  // the overlap of the last tile counts once
        const Value tgt = b.add(c[2], b.reduce_sum(b.select(is_t, t.logits, zero), {1}));
        return std::vector<Value>{m_new, l, tgt};
      },
      kXentLoop);
  const Value zero = full(b, n, 0.0);
  const Value lse_all = b.add(fin[0], b.log(fin[1]));
  const Value lse = b.select(p.trained, lse_all, zero);
  return XentForward{b.reduce_sum(b.select(p.trained, b.sub(lse_all, fin[2]), zero), {0}),
                     b.reduce_sum(b.mul(lse, lse), {0}),
                     b.reduce_sum(b.select(p.trained, full(b, n, 1, kS32), full(b, n, 0, kS32)), {0}), lse};
}

namespace {

// The backward on the tokens at hand (one device's, or all of them).
XentBackward local_backward(HloBuilder& b, const Value& h, const Value& w, const Value& targets,
                            const Value& mask, const Value& lse, const Value& scale, const XentOptions& o) {
  const Prep p = prepare(b, h, w, targets, mask, o, "xent_backward");
  const Value ho = operand(b, h, o.operands);
  expect_type(lse, kF32, "xent_backward", "lse");
  expect_dims(lse, {p.N}, "xent_backward", "lse");
  expect_type(scale, kF32, "xent_backward", "scale");
  expect_dims(scale, {}, "xent_backward", "scale");
  const std::vector<int64_t> n{p.N}, nc{p.N, p.C};
  // k_i = scale (1 + 2 z_loss lse_i)
  const Value k = b.mul(bcast(b, scale, n, {}),
                        b.add(full(b, n, 1.0), b.mul(full(b, n, double(float(2.0 * o.z_loss))), lse)));
  const std::vector<Value> init{full(b, {p.N, p.d}, 0.0), full(b, {p.Vr, p.d}, 0.0)};
  const auto fin = b.for_loop(
      p.nc, init,
      [&](HloBuilder& b, const Value& j, const std::vector<Value>& c) {
        const Tile t = tile(b, p, ho, w, j, o.operands);
        const Value e = b.mul(b.exp(b.sub(t.logits, bcast(b, lse, nc, {0}))), bcast(b, k, nc, {0}));
        const Value is_t = b.compare(t.col, bcast(b, targets, nc, {0}), Compare::kEq);
        const Value g0 = b.select(is_t, b.sub(e, bcast(b, scale, nc, {})), e);
        const Value keep = b.select(t.valid, bcast(b, p.trained, nc, {0}), full(b, nc, 0, kPred));
        const Value g = b.select(keep, g0, full(b, nc, 0.0));
        const Value go = operand(b, g, o.operands);
        const Value dh =
            b.add(c[0], b.dot_general(go, operand(b, t.wc, o.operands), {{}, {}, {1}, {0}}, kF32));
        const Value dwc = b.dot_general(go, ho, {{}, {}, {0}, {0}}, kF32);  // [C, d]
        // Added, not written: the last tile overlaps the one before (its masked columns add 0).
        const std::vector<Value> at{t.start, b.scalar(kS32, 0)};
        const Value dw = b.add(b.dynamic_slice(c[1], at, {p.C, p.d}), dwc);
        return std::vector<Value>{dh, b.dynamic_update_slice(c[1], dw, at)};
      },
      kXentLoop);
  return {fin[0], fin[1]};
}

}  // namespace

XentBackward xent_backward(HloBuilder& b, const Value& h, const Value& w, const Value& targets,
                           const Value& mask, const Value& lse, const Value& scale, const XentOptions& o) {
  if (o.mesh == nullptr || o.mesh->devices() <= 1)
    return local_backward(b, h, w, targets, mask, lse, scale, o);
  const Mesh& m = *o.mesh;
  const int64_t D = m.devices();
  prepare(b, h, w, targets, mask, o, "xent_backward");  // the whole operands' checks
  OLMO_CHECK(h.type().dims[0] % D == 0, "xla ops: xent_backward: ", h.type().dims[0],
             " tokens do not split over the mesh's ", D, " devices");
  const auto tokens = [&](const std::vector<int64_t>& dims) {
    return dim_sharding(m, dims, 0, Logical::kTokens, "xent_backward tokens");
  };
  const auto local = [&](const Value& x) {
    TensorType t = x.type();
    t.dims[0] /= D;
    return b.full_to_shard(x, tokens(x.type().dims), t);
  };
  const auto whole = [&](const Value& x) { return b.full_to_shard(x, sharding_replicated(), x.type()); };
  HloBuilder::DeviceGroups all(1);
  for (int64_t d = 0; d < D; ++d) all[0].push_back(d);
  XentOptions lo = o;
  lo.mesh = nullptr;
  const std::vector<int64_t>& wd = w.type().dims;
  const int split = wd[0] % D == 0 ? 0 : wd[1] % D == 0 ? 1 : -1;
  const auto res = b.call("xent_backward_tiles",
                          {local(h), whole(w), local(targets), local(mask), local(lse), whole(scale)},
                          [&](HloBuilder& b, const std::vector<Value>& a) {
                            const XentBackward g = local_backward(b, a[0], a[1], a[2], a[3], a[4], a[5], lo);
                            // Each device keeps its part of the sum along the first dimension the
                            // devices divide (else the whole sum).
                            return std::vector<Value>{g.dh, split < 0 ? b.all_reduce_sum(g.dw, all)
                                                                      : b.reduce_scatter(g.dw, split, all)};
                          });
  // dW's layout as the reduce-scatter over all devices in order left it
  std::vector<int64_t> tiles(2, 1);
  if (split >= 0) tiles[size_t(split)] = D;
  const std::string dw_sharding = split < 0 ? sharding_replicated() : sharding_tiled(tiles);
  return {b.shard_to_full(res[0], tokens(h.type().dims), h.type()),
          b.shard_to_full(res[1], dw_sharding, w.type())};
}

}  // namespace olmosft::xla::ops
