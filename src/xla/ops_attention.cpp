#include "xla/ops_attention.h"

#include <cmath>
#include <limits>

#include "xla/ops_util.h"

namespace olmosft::xla::ops {

using namespace detail;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The operands in the loops' layouts: heads first, GQA groups split out, keys padded to whole blocks.
struct Dims {
  int64_t T = 0, H = 0, Hkv = 0, G = 0, D = 0, Dv = 0, Bk = 0, nb = 0, Tp = 0;
};
struct Prep : Dims {
  Value qs;    // [Hkv, G, T, D]: scale * q
  Value kp;    // [Hkv, Tp, D]
  Value vp;    // [Hkv, Tp, Dv]
  Value seg;   // [T]
  Value segk;  // [Tp]: seg, then -1 for the padded keys
};

// [T, H, X] -> [Hkv, G, T, X]
Value to_groups(HloBuilder& b, const Dims& p, const Value& x) {
  const int64_t X = x.type().dims[2];
  return b.transpose(b.reshape(x, {p.T, p.Hkv, p.G, X}), {1, 2, 0, 3});
}
// [Hkv, G, T, X] -> [T, H, X]
Value from_groups(HloBuilder& b, const Dims& p, const Value& x) {
  const int64_t X = x.type().dims[3];
  return b.reshape(b.transpose(x, {2, 0, 1, 3}), {p.T, p.H, X});
}
// [T, Hkv, X] -> [Hkv, Tp, X] (zeros after T)
Value pad_keys(HloBuilder& b, const Dims& p, const Value& x) {
  Value y = x;
  const int64_t X = x.type().dims[2];
  if (p.Tp > p.T) y = b.concatenate({x, full(b, {p.Tp - p.T, p.Hkv, X}, 0.0)}, 0);
  return b.transpose(y, {1, 0, 2});
}

Prep prepare(HloBuilder& b, const Value& q, const Value& k, const Value& v, const Value& seg,
             const AttentionOptions& o, const char* op) {
  for (auto [x, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    expect_type(*x, kF32, op, name);
    OLMO_CHECK(x->type().rank() == 3, "xla ops: ", op, ": ", name, " must be [T, heads, dim], got ",
               x->type().mlir());
  }
  expect_type(seg, kS32, op, "seg");
  Dims p;
  p.T = q.type().dims[0];
  p.H = q.type().dims[1];
  p.D = q.type().dims[2];
  p.Hkv = k.type().dims[1];
  p.Dv = v.type().dims[2];
  OLMO_CHECK(p.T > 0 && p.Hkv > 0 && p.H % p.Hkv == 0, "xla ops: ", op, ": q heads ", p.H,
             " must be a multiple of kv heads ", p.Hkv, " (T = ", p.T, ")");
  expect_dims(k, {p.T, p.Hkv, p.D}, op, "k");
  expect_dims(v, {p.T, p.Hkv, p.Dv}, op, "v");
  expect_dims(seg, {p.T}, op, "seg");
  OLMO_CHECK(std::isfinite(o.scale) && o.block > 0, "xla ops: ", op,
             ": scale must be finite and block > 0, got ", o.scale, " and ", o.block);
  p.G = p.H / p.Hkv;
  p.Bk = std::min(o.block, p.T);
  p.nb = (p.T + p.Bk - 1) / p.Bk;
  p.Tp = p.nb * p.Bk;
  const Value qs = b.mul(to_groups(b, p, q), full(b, {p.Hkv, p.G, p.T, p.D}, double(float(o.scale))));
  const Value segk = p.Tp > p.T ? b.concatenate({seg, full(b, {p.Tp - p.T}, -1.0, kS32)}, 0) : seg;
  return Prep{p, qs, pad_keys(b, p, k), pad_keys(b, p, v), seg, segk};
}

Value logical_and(HloBuilder& b, const Value& x, const Value& y) {
  return b.select(x, y, b.constant(x.type(), 0));
}

// Which queries see which keys of the block starting at START (s32 scalar): pred [Hkv, G, T, Bk].
Value block_mask(HloBuilder& b, const Prep& p, const Value& start, int64_t window) {
  const std::vector<int64_t> tb{p.T, p.Bk};
  const Value segb = b.dynamic_slice(p.segk, {start}, {p.Bk});
  const Value sq = bcast(b, p.seg, tb, {0}), sk = bcast(b, segb, tb, {1});
  const Value qpos = b.iota({kS32, tb}, 0);
  const Value kpos = b.add(b.iota({kS32, tb}, 1), bcast(b, start, tb, {}));
  Value m =
      logical_and(b, b.compare(sq, full(b, tb, 0, kS32), Compare::kGe), b.compare(sq, sk, Compare::kEq));
  m = logical_and(b, m, b.compare(kpos, qpos, Compare::kLe));
  if (window > 0)
    m = logical_and(b, m, b.compare(b.sub(qpos, kpos), full(b, tb, double(window), kS32), Compare::kLt));
  return bcast(b, m, {p.Hkv, p.G, p.T, p.Bk}, {2, 3});
}

// One key block's K and V: [Hkv, Bk, D] and [Hkv, Bk, Dv].
std::pair<Value, Value> key_block(HloBuilder& b, const Prep& p, const Value& start) {
  const Value z = b.scalar(kS32, 0);
  return {b.dynamic_slice(p.kp, {z, start, z}, {p.Hkv, p.Bk, p.D}),
          b.dynamic_slice(p.vp, {z, start, z}, {p.Hkv, p.Bk, p.Dv})};
}

// scores [Hkv, G, T, Bk] = qs . k_block
Value scores(HloBuilder& b, const Prep& p, const Value& kb) {
  return b.dot_general(p.qs, kb, {{0}, {0}, {3}, {2}});
}

}  // namespace

AttentionForward attention_forward(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                   const Value& seg, const AttentionOptions& o) {
  const Prep p = prepare(b, q, k, v, seg, o, "attention_forward");
  const std::vector<int64_t> rows{p.Hkv, p.G, p.T}, sdims{p.Hkv, p.G, p.T, p.Bk},
      odims{p.Hkv, p.G, p.T, p.Dv};
  const std::vector<Value> init{full(b, rows, kNegInf), full(b, rows, 0.0), full(b, odims, 0.0)};
  const auto fin = b.for_loop(p.nb, init, [&](HloBuilder& b, const Value& j, const std::vector<Value>& c) {
    const Value start = b.mul(j, b.scalar(kS32, double(p.Bk)));
    const auto [kb, vb] = key_block(b, p, start);
    const Value mask = block_mask(b, p, start, o.window);
    const Value s = scores(b, p, kb);
    const Value neg_inf = full(b, sdims, kNegInf);
    const Value m_new = b.max(c[0], b.reduce_max(b.select(mask, s, neg_inf), {3}));
    const Value no_key = b.compare(m_new, full(b, rows, kNegInf), Compare::kEq);
    const Value m_safe = b.select(no_key, full(b, rows, 0.0), m_new);
    const Value pr = b.select(mask, b.exp(b.sub(s, bcast(b, m_safe, sdims, {0, 1, 2}))), full(b, sdims, 0.0));
    const Value alpha = b.select(b.compare(c[0], full(b, rows, kNegInf), Compare::kEq), full(b, rows, 0.0),
                                 b.exp(b.sub(c[0], m_safe)));
    const Value l = b.add(b.mul(c[1], alpha), b.reduce_sum(pr, {3}));
    const Value pv = b.dot_general(pr, vb, {{0}, {0}, {3}, {1}});  // [Hkv, G, T, Dv]
    const Value acc = b.add(b.mul(c[2], bcast(b, alpha, odims, {0, 1, 2})), pv);
    return std::vector<Value>{m_new, l, acc};
  });
  const Value seen = b.compare(fin[1], full(b, rows, 0.0), Compare::kGt);
  const Value l_safe = b.select(seen, fin[1], full(b, rows, 1.0));
  const Value out = b.select(bcast(b, seen, odims, {0, 1, 2}),
                             b.div(fin[2], bcast(b, l_safe, odims, {0, 1, 2})), full(b, odims, 0.0));
  const Value lse = b.select(seen, b.add(fin[0], b.log(l_safe)), full(b, rows, kNegInf));
  return {from_groups(b, p, out), b.reshape(lse, {p.H, p.T})};
}

AttentionBackward attention_backward(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                     const Value& seg, const Value& out, const Value& lse, const Value& dout,
                                     const AttentionOptions& o) {
  const Prep p = prepare(b, q, k, v, seg, o, "attention_backward");
  expect_dims(out, {p.T, p.H, p.Dv}, "attention_backward", "out");
  expect_dims(dout, {p.T, p.H, p.Dv}, "attention_backward", "dout");
  expect_dims(lse, {p.H, p.T}, "attention_backward", "lse");
  const std::vector<int64_t> rows{p.Hkv, p.G, p.T}, sdims{p.Hkv, p.G, p.T, p.Bk};
  const Value dog = to_groups(b, p, dout);
  const Value di = b.reduce_sum(b.mul(dog, to_groups(b, p, out)), {3});  // D_i = rowsum(dO * O)
  const Value lr = b.reshape(lse, rows);
  const Value lse_safe =
      b.select(b.compare(lr, full(b, rows, kNegInf), Compare::kEq), full(b, rows, 0.0), lr);
  const std::vector<Value> init{full(b, {p.Hkv, p.G, p.T, p.D}, 0.0), full(b, {p.Hkv, p.Tp, p.D}, 0.0),
                                full(b, {p.Hkv, p.Tp, p.Dv}, 0.0)};
  const auto fin = b.for_loop(p.nb, init, [&](HloBuilder& b, const Value& j, const std::vector<Value>& c) {
    const Value start = b.mul(j, b.scalar(kS32, double(p.Bk)));
    const auto [kb, vb] = key_block(b, p, start);
    const Value mask = block_mask(b, p, start, o.window);
    const Value s = scores(b, p, kb);
    const Value pr =
        b.select(mask, b.exp(b.sub(s, bcast(b, lse_safe, sdims, {0, 1, 2}))), full(b, sdims, 0.0));
    const Value dvb = b.dot_general(pr, dog, {{0}, {0}, {1, 2}, {1, 2}});  // [Hkv, Bk, Dv]
    const Value dp = b.dot_general(dog, vb, {{0}, {0}, {3}, {2}});         // [Hkv, G, T, Bk]
    const Value ds = b.mul(pr, b.sub(dp, bcast(b, di, sdims, {0, 1, 2})));
    const Value dkb = b.dot_general(ds, p.qs, {{0}, {0}, {1, 2}, {1, 2}});  // [Hkv, Bk, D], scale included
    const Value dq = b.add(c[0], b.dot_general(ds, kb, {{0}, {0}, {3}, {1}}));
    const Value z = b.scalar(kS32, 0);
    return std::vector<Value>{dq, b.dynamic_update_slice(c[1], dkb, {z, start, z}),
                              b.dynamic_update_slice(c[2], dvb, {z, start, z})};
  });
  const Value dq = b.mul(fin[0], full(b, {p.Hkv, p.G, p.T, p.D}, double(float(o.scale))));
  auto unpad = [&](const Value& x) {
    const int64_t X = x.type().dims[2];
    return b.transpose(b.slice(x, {0, 0, 0}, {p.Hkv, p.T, X}), {1, 0, 2});
  };
  return {from_groups(b, p, dq), unpad(fin[1]), unpad(fin[2])};
}

}  // namespace olmosft::xla::ops
