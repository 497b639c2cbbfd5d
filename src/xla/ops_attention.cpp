#include "xla/ops_attention.h"

#include <cmath>
#include <limits>
#include <optional>

#include "xla/hlo_loops.h"
#include "xla/mesh.h"
#include "xla/ops_util.h"

namespace olmosft::xla::ops {

using namespace detail;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One row's sizes; B is the block (queries and keys), nb the number of blocks, Tp = nb B the padded length.
// The queries may be a piece of the row (context parallelism, attention_*_piece): Tq of them from token
// q_off (a multiple of B), in nbq blocks padded to Tqp; otherwise Tq = T and q_off is 0.
struct Dims {
  int64_t T = 0, H = 0, Hkv = 0, G = 0, D = 0, Dv = 0, B = 0, nb = 0, Tp = 0;
  int64_t Tq = 0, nbq = 0, Tqp = 0;
};
// The operands in the loops' layouts: heads first, GQA groups split out, tokens padded to whole blocks
// (segment -1 after T, so the padding is masked like any padding token).
struct Prep : Dims {
  std::optional<Value> q_off;  // s32 scalar: the first query's token in the row (a piece's); none: 0
  Value qs;                    // [Hkv, G, Tqp, D]: scale * q
  Value kp;                    // [Hkv, Tp, D]
  Value vp;                    // [Hkv, Tp, Dv]
  Value segp;                  // [Tp]
  bool bf16 = false;           // qs, kp, vp are bf16 and every product takes bf16 operands (f32 result)
};

// X's tokens (dimension 0, N of them) padded to TO.
Value pad_to(HloBuilder& b, const Value& x, int64_t to) {
  const int64_t n = x.type().dims[0];
  if (to == n) return x;
  std::vector<int64_t> dims = x.type().dims;
  dims[0] = to - n;
  const double fill = x.type().type == kS32 ? -1.0 : 0.0;
  return b.concatenate({x, b.constant(TensorType{x.type().type, dims}, fill)}, 0);
}
Value pad_tokens(HloBuilder& b, const Dims& p, const Value& x) { return pad_to(b, x, p.Tp); }
// queries [Tq, H, X] -> [Hkv, G, Tqp, X]
Value to_groups(HloBuilder& b, const Dims& p, const Value& x) {
  const int64_t X = x.type().dims[2];
  return b.transpose(b.reshape(pad_to(b, x, p.Tqp), {p.Tqp, p.Hkv, p.G, X}), {1, 2, 0, 3});
}
// [Hkv, G, Tqp, X] -> [Tq, H, X]
Value from_groups(HloBuilder& b, const Dims& p, const Value& x) {
  const int64_t X = x.type().dims[3];
  return b.slice(b.reshape(b.transpose(x, {2, 0, 1, 3}), {p.Tqp, p.H, X}), {0, 0, 0}, {p.Tq, p.H, X});
}
// [T, Hkv, X] -> [Hkv, Tp, X]
Value to_heads(HloBuilder& b, const Dims& p, const Value& x) {
  return b.transpose(pad_tokens(b, p, x), {1, 0, 2});
}
// [Hkv, Tp, X] -> [T, Hkv, X]
Value from_heads(HloBuilder& b, const Dims& p, const Value& x) {
  const int64_t X = x.type().dims[2];
  return b.transpose(b.slice(x, {0, 0, 0}, {p.Hkv, p.T, X}), {1, 0, 2});
}

// Q_OFF: the queries are a piece of the row from that token (attention_*_piece), else the whole row.
Prep prepare(HloBuilder& b, const Value& q, const Value& k, const Value& v, const Value& seg,
             const AttentionOptions& o, const char* op, const std::optional<Value>& q_off = std::nullopt) {
  for (auto [x, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    expect_type(*x, kF32, op, name);
    OLMO_CHECK(x->type().rank() == 3, "xla ops: ", op, ": ", name, " must be [T, heads, dim], got ",
               x->type().mlir());
  }
  expect_type(seg, kS32, op, "seg");
  Dims p;
  p.T = k.type().dims[0];
  p.Tq = q.type().dims[0];
  p.H = q.type().dims[1];
  p.D = q.type().dims[2];
  p.Hkv = k.type().dims[1];
  p.Dv = v.type().dims[2];
  OLMO_CHECK(p.T > 0 && p.Hkv > 0 && p.H % p.Hkv == 0, "xla ops: ", op, ": q heads ", p.H,
             " must be a multiple of kv heads ", p.Hkv, " (T = ", p.T, ")");
  OLMO_CHECK(q_off || p.Tq == p.T, "xla ops: ", op, ": q has ", p.Tq, " tokens, k ", p.T);
  expect_dims(k, {p.T, p.Hkv, k.type().dims[2]}, op, "k");
  OLMO_CHECK(k.type().dims[2] == p.D, "xla ops: ", op, ": k must be [T, Hkv, ", p.D, "], got ",
             k.type().mlir());
  expect_dims(v, {p.T, p.Hkv, p.Dv}, op, "v");
  expect_dims(seg, {p.T}, op, "seg");
  OLMO_CHECK(std::isfinite(o.scale) && o.block > 0, "xla ops: ", op,
             ": scale must be finite and block > 0, got ", o.scale, " and ", o.block);
  p.G = p.H / p.Hkv;
  p.B = std::min(o.block, p.T);
  if (q_off) {  // a piece: whole blocks from its first token (the largest block <= o.block dividing Tq)
    OLMO_CHECK(p.T % p.Tq == 0, "xla ops: ", op, ": a piece of ", p.Tq, " queries of a row of ", p.T);
    p.B = std::min(o.block, p.Tq);
    while (p.Tq % p.B != 0) --p.B;
  }
  p.nb = (p.T + p.B - 1) / p.B;
  p.Tp = p.nb * p.B;
  p.nbq = (p.Tq + p.B - 1) / p.B;
  p.Tqp = p.nbq * p.B;
  const Value qs = b.mul(to_groups(b, p, q), full(b, {p.Hkv, p.G, p.Tqp, p.D}, double(float(o.scale))));
  const bool bf16 = o.operands == Operands::kBF16;
  auto in = [&](const Value& x) { return bf16 ? b.convert(x, ElementType::kBF16) : x; };
  return Prep{p, q_off, in(qs), in(to_heads(b, p, k)), in(to_heads(b, p, v)), pad_tokens(b, p, seg), bf16};
}

// The row token of the piece's query token LOCAL (s32 scalars).
Value row_token(HloBuilder& b, const Prep& p, const Value& local) {
  return p.q_off ? b.add(*p.q_off, local) : local;
}

// A product of the loops: f32 operands (HIGHEST precision), or with P.bf16 bf16 operands (an f32 operand,
// P or dS, rounded here) accumulated in f32.
Value product(HloBuilder& b, const Prep& p, const Value& x, const Value& y, const DotDims& dims) {
  if (!p.bf16) return b.dot_general(x, y, dims);
  auto in = [&](const Value& v) {
    return v.type().type == ElementType::kBF16 ? v : b.convert(v, ElementType::kBF16);
  };
  return b.dot_general(in(x), in(y), dims, ElementType::kF32);
}

Value i32(HloBuilder& b, int64_t v) { return b.scalar(kS32, double(v)); }

// Block rows starting at token START: [Hkv, G, B, ...] of a [Hkv, G, Tp, ...] value, [Hkv, B, X] of a
// [Hkv, Tp, X] one.
Value q_rows(HloBuilder& b, const Dims& p, const Value& x, const Value& start) {
  std::vector<Value> at{i32(b, 0), i32(b, 0), start};
  std::vector<int64_t> sizes{p.Hkv, p.G, p.B};
  if (x.type().rank() == 4) {
    at.push_back(i32(b, 0));
    sizes.push_back(x.type().dims[3]);
  }
  return b.dynamic_slice(x, at, sizes);
}
Value k_rows(HloBuilder& b, const Dims& p, const Value& x, const Value& start) {
  return b.dynamic_slice(x, {i32(b, 0), start, i32(b, 0)}, {p.Hkv, p.B, x.type().dims[2]});
}

Value logical_and(HloBuilder& b, const Value& x, const Value& y) {
  return b.select(x, y, b.constant(x.type(), 0));
}

// Document extents of the block at START (s32 scalar): over the block's non-padding tokens, the first token
// (FIRST) or the last token (else) of their documents; Tp (FIRST) or -1 when the block is all padding. Each
// document is one contiguous run, so these bound what the block can see (queries) or be seen by (keys). A
// [B, Tp] comparison: O(T x block) memory, O(T) work per block.
Value document_edge(HloBuilder& b, const Prep& p, const Value& start, bool first) {
  const std::vector<int64_t> bt{p.B, p.Tp};
  const Value sb = bcast(b, b.dynamic_slice(p.segp, {start}, {p.B}), bt, {0});
  const Value same = logical_and(b, b.compare(sb, full(b, bt, 0, kS32), Compare::kGe),
                                 b.compare(sb, bcast(b, p.segp, bt, {1}), Compare::kEq));
  const Value idx = b.iota({kS32, bt}, 1);
  if (first)  // min = -max(-x)
    return b.neg(b.reduce_max(b.select(same, b.neg(idx), full(b, bt, -double(p.Tp), kS32)), {0, 1}));
  return b.reduce_max(b.select(same, idx, full(b, bt, -1, kS32)), {0, 1});
}

// Which queries of the block at QS see which keys of the block at KS (token indices, s32 scalars):
// pred [Hkv, G, B, B].
Value block_mask(HloBuilder& b, const Prep& p, const Value& qs, const Value& ks, int64_t window) {
  const std::vector<int64_t> bb{p.B, p.B};
  const Value sq = bcast(b, b.dynamic_slice(p.segp, {qs}, {p.B}), bb, {0});
  const Value sk = bcast(b, b.dynamic_slice(p.segp, {ks}, {p.B}), bb, {1});
  const Value qpos = b.add(b.iota({kS32, bb}, 0), bcast(b, qs, bb, {}));
  const Value kpos = b.add(b.iota({kS32, bb}, 1), bcast(b, ks, bb, {}));
  Value m =
      logical_and(b, b.compare(sq, full(b, bb, 0, kS32), Compare::kGe), b.compare(sq, sk, Compare::kEq));
  m = logical_and(b, m, b.compare(kpos, qpos, Compare::kLe));
  if (window > 0)
    m = logical_and(b, m, b.compare(b.sub(qpos, kpos), full(b, bb, double(window), kS32), Compare::kLt));
  return bcast(b, m, {p.Hkv, p.G, p.B, p.B}, {2, 3});
}

// The online softmax state of one query block: running max, sum and unnormalised output.
struct Running {
  Value m, l, acc;  // [Hkv, G, B], [Hkv, G, B], [Hkv, G, B, Dv]
};
Running online_step(HloBuilder& b, const Prep& p, const Value& qb, const Value& kb, const Value& vb,
                    const Value& mask, const Running& r) {
  const std::vector<int64_t> rows{p.Hkv, p.G, p.B}, sdims{p.Hkv, p.G, p.B, p.B}, odims{p.Hkv, p.G, p.B, p.Dv};
  const Value s = product(b, p, qb, kb, {{0}, {0}, {3}, {2}});  // [Hkv, G, B, B]
  const Value m_new = b.max(r.m, b.reduce_max(b.select(mask, s, full(b, sdims, kNegInf)), {3}));
  const Value no_key = b.compare(m_new, full(b, rows, kNegInf), Compare::kEq);
  const Value m_safe = b.select(no_key, full(b, rows, 0.0), m_new);
  const Value pr = b.select(mask, b.exp(b.sub(s, bcast(b, m_safe, sdims, {0, 1, 2}))), full(b, sdims, 0.0));
  const Value alpha = b.select(b.compare(r.m, full(b, rows, kNegInf), Compare::kEq), full(b, rows, 0.0),
                               b.exp(b.sub(r.m, m_safe)));
  const Value l = b.add(b.mul(r.l, alpha), b.reduce_sum(pr, {3}));
  const Value pv = product(b, p, pr, vb, {{0}, {0}, {3}, {1}});  // [Hkv, G, B, Dv]
  return {m_new, l, b.add(b.mul(r.acc, bcast(b, alpha, odims, {0, 1, 2})), pv)};
}

// Query block QB's output and lse from its final state: [Hkv, G, B, Dv] and [Hkv, G, B].
std::pair<Value, Value> finish(HloBuilder& b, const Prep& p, const Running& r) {
  const std::vector<int64_t> rows{p.Hkv, p.G, p.B}, odims{p.Hkv, p.G, p.B, p.Dv};
  const Value seen = b.compare(r.l, full(b, rows, 0.0), Compare::kGt);
  const Value l_safe = b.select(seen, r.l, full(b, rows, 1.0));
  const Value out = b.select(bcast(b, seen, odims, {0, 1, 2}),
                             b.div(r.acc, bcast(b, l_safe, odims, {0, 1, 2})), full(b, odims, 0.0));
  return {out, b.select(seen, b.add(r.m, b.log(l_safe)), full(b, rows, kNegInf))};
}

// Query blocks in a loop; for each, a while loop over the key blocks it can see: from the first one of its
// documents and inside the window to its own (causal), so masked-out blocks cost nothing.
// Q_OFF: the queries are the piece of the row from that token (k, v and seg the whole row).
AttentionForward row_forward(HloBuilder& b, const Value& q, const Value& k, const Value& v, const Value& seg,
                             const AttentionOptions& o, const std::optional<Value>& q_off = std::nullopt) {
  const Prep p = prepare(b, q, k, v, seg, o, "attention_forward", q_off);
  const std::vector<int64_t> rows{p.Hkv, p.G, p.B}, odims{p.Hkv, p.G, p.B, p.Dv};
  const std::vector<Value> init{full(b, {p.Hkv, p.G, p.Tqp, p.Dv}, 0.0),
                                full(b, {p.Hkv, p.G, p.Tqp}, kNegInf)};
  const auto fin = b.for_loop(
      p.nbq, init,
      [&](HloBuilder& b, const Value& qbl, const std::vector<Value>& c) {
        const Value ql = b.mul(qbl, i32(b, p.B));  // in the piece
        const Value qs = row_token(b, p, ql);      // in the row
        const Value qb = b.div(qs, i32(b, p.B));
        const Value qblk = q_rows(b, p, p.qs, ql);
        // From the block of the earliest key any of its queries can see (its documents' first token, the
        // window's start) to its own; an all-padding block (first token Tp) runs no key block.
        Value lo = b.div(document_edge(b, p, qs, true), i32(b, p.B));
        if (o.window > 0)
          lo = b.max(lo, b.div(b.max(i32(b, 0), b.sub(qs, i32(b, o.window - 1))), i32(b, p.B)));
        const auto st = b.while_loop(
            {lo, full(b, rows, kNegInf), full(b, rows, 0.0), full(b, odims, 0.0)},
            [&](HloBuilder& b, const std::vector<Value>& a) {
              return std::vector<Value>{b.compare(a[0], qb, Compare::kLe)};
            },
            [&](HloBuilder& b, const std::vector<Value>& a) {
              const Value ks = b.mul(a[0], i32(b, p.B));
              const Running r = online_step(b, p, qblk, k_rows(b, p, p.kp, ks), k_rows(b, p, p.vp, ks),
                                            block_mask(b, p, qs, ks, o.window), {a[1], a[2], a[3]});
              return std::vector<Value>{b.add(a[0], i32(b, 1)), r.m, r.l, r.acc};
            });
        const auto [out, lse] = finish(b, p, {st[1], st[2], st[3]});
        const Value z = i32(b, 0);
        return std::vector<Value>{b.dynamic_update_slice(c[0], out, {z, z, ql, z}),
                                  b.dynamic_update_slice(c[1], lse, {z, z, ql})};
      },
      kAttentionLoop);
  const Value lse = b.slice(fin[1], {0, 0, 0}, {p.Hkv, p.G, p.Tq});
  return {from_groups(b, p, fin[0]), b.reshape(lse, {p.H, p.Tq})};
}

// The backward's per-query inputs in the loops' layout: dout, D_i = rowsum(dO * O) and lse (0 for padding).
struct BackInputs {
  Value dog;  // [Hkv, G, Tp, Dv] (bf16 with Prep::bf16: only products read it)
  Value di;   // [Hkv, G, Tp]
  Value lse;  // [Hkv, G, Tp]
};
BackInputs back_inputs(HloBuilder& b, const Prep& p, const Value& out, const Value& lse, const Value& dout) {
  expect_dims(out, {p.Tq, p.H, p.Dv}, "attention_backward", "out");
  expect_dims(dout, {p.Tq, p.H, p.Dv}, "attention_backward", "dout");
  expect_dims(lse, {p.H, p.Tq}, "attention_backward", "lse");
  const std::vector<int64_t> rows{p.Hkv, p.G, p.Tqp};
  const Value dog = to_groups(b, p, dout);
  const Value di = b.reduce_sum(b.mul(dog, to_groups(b, p, out)), {3});
  Value lr = b.reshape(lse, {p.Hkv, p.G, p.Tq});
  if (p.Tqp > p.Tq) lr = b.concatenate({lr, full(b, {p.Hkv, p.G, p.Tqp - p.Tq}, 0.0)}, 2);
  const Value lse_safe =
      b.select(b.compare(lr, full(b, rows, kNegInf), Compare::kEq), full(b, rows, 0.0), lr);
  return {p.bf16 ? b.convert(dog, ElementType::kBF16) : dog, di, lse_safe};
}

// FlashAttention-2's order: key blocks in a loop; for each, a while loop over the query blocks that can see
// it (from its own, causal, to the last of its documents and inside the window), accumulating its dk and dv
// and adding into dq.
// Q_OFF as for row_forward: dq is the piece's, dk and dv the whole row's, summed over the piece's queries
// only (the caller adds the other pieces' terms).
AttentionBackward row_backward(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                               const Value& seg, const Value& out, const Value& lse, const Value& dout,
                               const AttentionOptions& o, const std::optional<Value>& q_off = std::nullopt) {
  const Prep p = prepare(b, q, k, v, seg, o, "attention_backward", q_off);
  const BackInputs in = back_inputs(b, p, out, lse, dout);
  const std::vector<int64_t> sdims{p.Hkv, p.G, p.B, p.B};
  const std::vector<Value> init{full(b, {p.Hkv, p.G, p.Tqp, p.D}, 0.0), full(b, {p.Hkv, p.Tp, p.D}, 0.0),
                                full(b, {p.Hkv, p.Tp, p.Dv}, 0.0)};
  // the piece's query blocks, in row blocks: [q0, q1]
  const Value q0 = p.q_off ? b.div(*p.q_off, i32(b, p.B)) : i32(b, 0);
  const Value q1 = b.add(q0, i32(b, p.nbq - 1));
  const auto fin = b.for_loop(
      p.nb, init,
      [&](HloBuilder& b, const Value& kb, const std::vector<Value>& c) {
        const Value ks = b.mul(kb, i32(b, p.B));
        const Value kblk = k_rows(b, p, p.kp, ks), vblk = k_rows(b, p, p.vp, ks);
        // To the block of the last query that can see any of its keys (its documents' last token, the
        // window's end); an all-padding block (last token -1) runs no query block.
        const Value last = document_edge(b, p, ks, false);
        Value hi = b.select(b.compare(last, i32(b, 0), Compare::kLt), i32(b, -1), b.div(last, i32(b, p.B)));
        if (o.window > 0) hi = b.min(hi, b.div(b.add(ks, i32(b, p.B + o.window - 2)), i32(b, p.B)));
        Value lo = kb;
        if (p.q_off) {  // only the piece's query blocks
          lo = b.max(lo, q0);
          hi = b.min(hi, q1);
        }
        const auto st = b.while_loop(
            {lo, full(b, {p.Hkv, p.B, p.D}, 0.0), full(b, {p.Hkv, p.B, p.Dv}, 0.0), c[0]},
            [&](HloBuilder& b, const std::vector<Value>& a) {
              return std::vector<Value>{b.compare(a[0], hi, Compare::kLe)};
            },
            [&](HloBuilder& b, const std::vector<Value>& a) {
              const Value qs = b.mul(a[0], i32(b, p.B));            // in the row
              const Value ql = p.q_off ? b.sub(qs, *p.q_off) : qs;  // in the piece
              const Value qblk = q_rows(b, p, p.qs, ql), dob = q_rows(b, p, in.dog, ql);
              const Value s = product(b, p, qblk, kblk, {{0}, {0}, {3}, {2}});  // [Hkv, G, B, B]
              const Value pr = b.select(block_mask(b, p, qs, ks, o.window),
                                        b.exp(b.sub(s, bcast(b, q_rows(b, p, in.lse, ql), sdims, {0, 1, 2}))),
                                        full(b, sdims, 0.0));
              const Value dv =
                  b.add(a[2], product(b, p, pr, dob, {{0}, {0}, {1, 2}, {1, 2}}));  // [Hkv, B, Dv]
              const Value dp = product(b, p, dob, vblk, {{0}, {0}, {3}, {2}});      // [Hkv, G, B, B]
              const Value ds = b.mul(pr, b.sub(dp, bcast(b, q_rows(b, p, in.di, ql), sdims, {0, 1, 2})));
              const Value dk =
                  b.add(a[1], product(b, p, ds, qblk, {{0}, {0}, {1, 2}, {1, 2}}));  // scale included
              const Value dqb = b.add(q_rows(b, p, a[3], ql), product(b, p, ds, kblk, {{0}, {0}, {3}, {1}}));
              const Value z = i32(b, 0);
              return std::vector<Value>{b.add(a[0], i32(b, 1)), dk, dv,
                                        b.dynamic_update_slice(a[3], dqb, {z, z, ql, z})};
            });
        const Value z = i32(b, 0);
        return std::vector<Value>{st[3], b.dynamic_update_slice(c[1], st[1], {z, ks, z}),
                                  b.dynamic_update_slice(c[2], st[2], {z, ks, z})};
      },
      kAttentionLoop);
  const Value dq = b.mul(fin[0], full(b, {p.Hkv, p.G, p.Tqp, p.D}, double(float(o.scale))));
  return {from_groups(b, p, dq), from_heads(b, p, fin[1]), from_heads(b, p, fin[2])};
}

// Row R (s32 scalar) of a [B, ...] value, without the batch dimension, and its inverse into ALL.
Value row(HloBuilder& b, const Value& x, const Value& r) {
  std::vector<int64_t> sizes = x.type().dims;
  sizes[0] = 1;
  std::vector<Value> at{r};
  for (size_t i = 1; i < sizes.size(); ++i) at.push_back(i32(b, 0));
  return b.reshape(b.dynamic_slice(x, at, sizes), std::vector<int64_t>(sizes.begin() + 1, sizes.end()));
}
Value put_row(HloBuilder& b, const Value& all, const Value& x, const Value& r) {
  std::vector<int64_t> dims{1};
  dims.insert(dims.end(), x.type().dims.begin(), x.type().dims.end());
  std::vector<Value> at{r};
  for (size_t i = 1; i < dims.size(); ++i) at.push_back(i32(b, 0));
  return b.dynamic_update_slice(all, b.reshape(x, dims), at);
}
// The batch size of the [B, T, ...] form (0 for the one-row form), checked across the operands.
int64_t batch_of(const Value& q, const std::vector<const Value*>& rest, const Value& seg, const char* op) {
  if (q.type().rank() != 4) return 0;
  const int64_t B = q.type().dims[0];
  for (const Value* x : rest)
    OLMO_CHECK(x->type().rank() == 4 && x->type().dims[0] == B, "xla ops: ", op,
               ": with q [B, T, H, D] = ", q.type().mlir(), " every tensor needs the batch dimension B = ", B,
               ", got ", x->type().mlir());
  OLMO_CHECK(seg.type().rank() == 2 && seg.type().dims[0] == B, "xla ops: ", op,
             ": seg must be [B, T] for q ", q.type().mlir(), ", got ", seg.type().mlir());
  return B;
}

// ---- over a device mesh (AttentionOptions::mesh) ----
// The operands are row tiles [B * C, T / C, ...] in the mesh's blocked order (xla/mesh.h), each device's
// tiles (its rows' pieces) taken into a manual region. There, the keys, values and segments of each row are
// gathered from the devices holding its pieces (sequence_groups, in token order), every device computes its
// own queries against the whole row (row_forward with the piece's first token), and in the backward each
// device's dk and dv terms of the whole row are summed over those devices into their own pieces
// (reduce_scatter). Causal masks, windows reaching into earlier pieces and documents crossing pieces follow
// from the gathered segments and the row positions. No load balancing (no reorder: the row's token order is
// the order every other layer sees).
struct MeshTiles {
  const Mesh& m;
  int64_t C;
  HloBuilder::DeviceGroups groups;
  std::optional<Value> ids;  // with C > 1, this device's index (s32 [1], manual): an iota over the devices
  MeshTiles(HloBuilder& b, const Mesh& mesh) : m(mesh), C(mesh.seq_shards()), groups(sequence_groups(mesh)) {
    const int64_t D = m.devices();
    if (C > 1) ids = b.full_to_shard(b.iota({kS32, {D}}, 0), sharding({D}), {kS32, {1}});
  }
  std::string sharding(const std::vector<int64_t>& dims) const {
    return dim_sharding(m, dims, 0, Logical::kRowTiles, "attention row tiles");
  }
  Value local(HloBuilder& b, const Value& x) const {
    TensorType t = x.type();
    t.dims[0] /= m.devices();
    return b.full_to_shard(x, sharding(x.type().dims), t);
  }
  Value global(HloBuilder& b, const Value& x) const {
    TensorType t = x.type();
    t.dims[0] *= m.devices();
    return b.shard_to_full(x, sharding(t.dims), t);
  }
  // Inside the region (the called function; IDS its argument): where this device's piece of its rows
  // starts, a row's keys, values and segments from the devices holding its pieces, and a sum over them
  // left on each device for its own piece.
  std::optional<Value> piece_start(HloBuilder& b, const std::optional<Value>& id, int64_t piece) const {
    if (!id) return std::nullopt;
    return b.mul(b.rem(b.reshape(*id, {}), i32(b, C)), i32(b, piece));
  }
  Value whole_rows(HloBuilder& b, const Value& x) const { return C > 1 ? b.all_gather(x, 1, groups) : x; }
  Value own_piece(HloBuilder& b, const Value& x) const { return C > 1 ? b.reduce_scatter(x, 1, groups) : x; }
  // The region's arguments: the tiles of XS, then the device index.
  std::vector<Value> arguments(HloBuilder& b, const std::vector<const Value*>& xs) const {
    std::vector<Value> a;
    for (const Value* x : xs) a.push_back(local(b, *x));
    if (ids) a.push_back(*ids);
    return a;
  }
};

void check_mesh_operands(const Value& q, const Mesh& m, const char* op) {
  OLMO_CHECK(q.type().rank() == 4 && q.type().dims[0] % m.devices() == 0, "xla ops: ", op,
             ": over a mesh of ", m.devices(),
             " devices q must be row tiles [B * C, T / C, H, D] with B * C a ",
             "multiple of the devices, got ", q.type().mlir());
}

AttentionForward mesh_forward(HloBuilder& b, const Value& q, const Value& k, const Value& v, const Value& seg,
                              const AttentionOptions& o) {
  check_mesh_operands(q, *o.mesh, "attention_forward");
  const MeshTiles t(b, *o.mesh);
  const auto res =
      b.call("attention_forward_tiles", t.arguments(b, {&q, &k, &v, &seg}),
             [&](HloBuilder& b, const std::vector<Value>& a) {
               const std::optional<Value> q_off =
                   t.piece_start(b, t.ids ? std::optional(a[4]) : std::nullopt, q.type().dims[1]);
               const Value& ql = a[0];
               const Value kf = t.whole_rows(b, a[1]), vf = t.whole_rows(b, a[2]), sf = t.whole_rows(b, a[3]);
               const auto& qd = ql.type().dims;
               const std::vector<Value> init{full(b, {qd[0], qd[1], qd[2], vf.type().dims[3]}, 0.0),
                                             full(b, {qd[0], qd[2], qd[1]}, 0.0)};
               return b.for_loop(
                   qd[0], init,
                   [&](HloBuilder& b, const Value& r, const std::vector<Value>& c) {
                     const AttentionForward f =
                         row_forward(b, row(b, ql, r), row(b, kf, r), row(b, vf, r), row(b, sf, r), o, q_off);
                     return std::vector<Value>{put_row(b, c[0], f.out, r), put_row(b, c[1], f.lse, r)};
                   },
                   kAttentionLoop);
             });
  return {t.global(b, res[0]), t.global(b, res[1])};
}

AttentionBackward mesh_backward(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                const Value& seg, const Value& out, const Value& lse, const Value& dout,
                                const AttentionOptions& o) {
  check_mesh_operands(q, *o.mesh, "attention_backward");
  const MeshTiles t(b, *o.mesh);
  const auto res =
      b.call("attention_backward_tiles", t.arguments(b, {&q, &k, &v, &seg, &out, &lse, &dout}),
             [&](HloBuilder& b, const std::vector<Value>& a) {
               const std::optional<Value> q_off =
                   t.piece_start(b, t.ids ? std::optional(a[7]) : std::nullopt, q.type().dims[1]);
               const Value& ql = a[0];
               const Value kf = t.whole_rows(b, a[1]), vf = t.whole_rows(b, a[2]), sf = t.whole_rows(b, a[3]);
               const std::vector<Value> init{full(b, ql.type().dims, 0.0), full(b, kf.type().dims, 0.0),
                                             full(b, vf.type().dims, 0.0)};
               const auto fin = b.for_loop(
                   ql.type().dims[0], init,
                   [&](HloBuilder& b, const Value& r, const std::vector<Value>& c) {
                     const AttentionBackward g =
                         row_backward(b, row(b, ql, r), row(b, kf, r), row(b, vf, r), row(b, sf, r),
                                      row(b, a[4], r), row(b, a[5], r), row(b, a[6], r), o, q_off);
                     return std::vector<Value>{put_row(b, c[0], g.dq, r), put_row(b, c[1], g.dk, r),
                                               put_row(b, c[2], g.dv, r)};
                   },
                   kAttentionLoop);
               return std::vector<Value>{fin[0], t.own_piece(b, fin[1]), t.own_piece(b, fin[2])};
             });
  return {t.global(b, res[0]), t.global(b, res[1]), t.global(b, res[2])};
}

}  // namespace

AttentionForward attention_forward(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                   const Value& seg, const AttentionOptions& o) {
  if (o.mesh != nullptr && o.mesh->devices() > 1) return mesh_forward(b, q, k, v, seg, o);
  const int64_t B = batch_of(q, {&k, &v}, seg, "attention_forward");
  if (B == 0) return row_forward(b, q, k, v, seg, o);
  const auto& qd = q.type().dims;
  const std::vector<Value> init{full(b, {B, qd[1], qd[2], v.type().dims[3]}, 0.0),
                                full(b, {B, qd[2], qd[1]}, 0.0)};
  const auto fin = b.for_loop(
      B, init,
      [&](HloBuilder& b, const Value& r, const std::vector<Value>& c) {
        const AttentionForward f =
            row_forward(b, row(b, q, r), row(b, k, r), row(b, v, r), row(b, seg, r), o);
        return std::vector<Value>{put_row(b, c[0], f.out, r), put_row(b, c[1], f.lse, r)};
      },
      kAttentionLoop);
  return {fin[0], fin[1]};
}

AttentionBackward attention_backward(HloBuilder& b, const Value& q, const Value& k, const Value& v,
                                     const Value& seg, const Value& out, const Value& lse, const Value& dout,
                                     const AttentionOptions& o) {
  if (o.mesh != nullptr && o.mesh->devices() > 1) return mesh_backward(b, q, k, v, seg, out, lse, dout, o);
  const int64_t B = batch_of(q, {&k, &v, &out, &dout}, seg, "attention_backward");
  if (B == 0) return row_backward(b, q, k, v, seg, out, lse, dout, o);
  OLMO_CHECK(lse.type().rank() == 3 && lse.type().dims[0] == B,
             "xla ops: attention_backward: lse must be [B, H, T], got ", lse.type().mlir());
  const std::vector<Value> init{full(b, q.type().dims, 0.0), full(b, k.type().dims, 0.0),
                                full(b, v.type().dims, 0.0)};
  const auto fin = b.for_loop(
      B, init,
      [&](HloBuilder& b, const Value& r, const std::vector<Value>& c) {
        const AttentionBackward g = row_backward(b, row(b, q, r), row(b, k, r), row(b, v, r), row(b, seg, r),
                                                 row(b, out, r), row(b, lse, r), row(b, dout, r), o);
        return std::vector<Value>{put_row(b, c[0], g.dq, r), put_row(b, c[1], g.dk, r),
                                  put_row(b, c[2], g.dv, r)};
      },
      kAttentionLoop);
  return {fin[0], fin[1], fin[2]};
}

}  // namespace olmosft::xla::ops
