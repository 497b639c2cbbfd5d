// The delta rule and its KDA/GDN neighbours as StableHLO (see delta_rule_emit.h).
#include "model/delta_rule_emit.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "kernels/kda.h"
#include "xla/hlo_loops.h"

namespace olmosft::model::unit::delta_emit {

constexpr xla::ElementType kF32 = xla::ElementType::kF32;
constexpr xla::ElementType kS32 = xla::ElementType::kS32;

Value full(HloBuilder& b, const std::vector<int64_t>& dims, double v) { return b.constant({kF32, dims}, v); }
// X [R, C] broadcast to DIMS with its dimensions at BDIMS (shorthand).
Value bc(HloBuilder& b, const Value& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& bdims) {
  return b.broadcast_in_dim(x, dims, bdims);
}
std::vector<int64_t> with_dim(std::vector<int64_t> d, size_t i, int64_t v) {
  d[i] = v;
  return d;
}

Rows rows_of(const xla::Mesh* mesh, int64_t BT, int64_t TT) {
  Rows r;
  if (mesh != nullptr && mesh->devices() > 1)
    r.mesh = mesh, r.R = mesh->batch_shards(), r.S = mesh->seq_shards();
  OLMO_CHECK(BT % (r.R * r.S) == 0, "delta rule: ", BT, " row tiles do not split over ", r.R, " x ", r.S);
  r.Bl = BT / (r.R * r.S);
  r.Tl = TT;
  return r;
}

Value lay_out(HloBuilder& b, const Rows& r, const Value& x, const std::vector<xla::Logical>& logical) {
  if (r.mesh == nullptr) return x;
  return b.constrain(x, xla::mesh_sharding(*r.mesh, x.type().dims, logical, "the delta rule's whole rows"));
}

// Tile (g, c, i) of the token array (device g * S + c holds rows g * Bl + i, tokens c * Tl ..) as the
// whole-row view: [R, S, Bl, Tl, W] -> [R, Bl, S, Tl, W].
Value to_rows(HloBuilder& b, const Rows& r, const Value& x) {
  const int64_t W = x.type().dims[1];
  if (r.S == 1) return b.reshape(x, {r.B(), r.T(), W});
  const Value y = b.transpose(b.reshape(x, {r.R, r.S, r.Bl, r.Tl, W}), {0, 2, 1, 3, 4});
  return lay_out(b, r, b.reshape(y, {r.B(), r.T(), W}),
                 {xla::Logical::kRows, xla::Logical::kSeq, xla::Logical::kNone});
}
Value from_rows(HloBuilder& b, const Rows& r, const Value& y) {
  const int64_t W = y.type().dims[2];
  if (r.S == 1) return b.reshape(y, {r.B() * r.T(), W});
  const Value l = lay_out(b, r, y, {xla::Logical::kRows, xla::Logical::kSeq, xla::Logical::kNone});
  const Value x = b.transpose(b.reshape(l, {r.R, r.Bl, r.S, r.Tl, W}), {0, 2, 1, 3, 4});
  return b.reshape(x, {r.B() * r.T(), W});
}
Value time_major(HloBuilder& b, const Rows& r, const Value& x, int64_t H, int64_t D) {
  using xla::Logical;
  const Value y = b.transpose(b.reshape(to_rows(b, r, x), {r.B(), r.T(), H, D}), {1, 0, 2, 3});
  return lay_out(b, r, y, {Logical::kNone, Logical::kRows, Logical::kHeads, Logical::kNone});
}
Value seg_rows(HloBuilder& b, const Rows& r, const Value& seg) {
  return b.reshape(to_rows(b, r, b.reshape(seg, {r.B() * r.T(), 1})), {r.B(), r.T()});
}

// X [B, T, ...] moved S tokens later in time (S > 0: y[t] = x[t - S]) or earlier (S < 0: y[t] = x[t - S]),
// zero where the source is outside the row.
Value shift_time(HloBuilder& b, const Value& x, int64_t s) {
  const std::vector<int64_t>& d = x.type().dims;
  const int64_t a = s < 0 ? -s : s;
  if (s == 0) return x;
  if (a >= d[1]) return b.constant(x.type(), 0.0);
  const Value z = b.constant({x.type().type, with_dim(d, 1, a)}, 0.0);
  const std::vector<int64_t> lo(d.size(), 0);
  if (s > 0) return b.concatenate({z, b.slice(x, lo, with_dim(d, 1, d[1] - a))}, 1);
  return b.concatenate({b.slice(x, with_dim(lo, 1, a), d), z}, 1);
}

// The documents of a [B, T] batch (kernels/kda.h "Segments"), as f32 0/1 masks [B, T]:
//   valid[t] = seg[t] >= 0;  start[t] = valid[t] and (t == 0 or seg[t] != seg[t-1]) (a document's first
//   token) conv[s][t] = token t - s is in t's document (and t is not padding): conv[0] = valid, conv[s] =
//   conv[s-1] and not start[t - s + 1]   (no document starts in (t - s, t])
DocMasks doc_masks(HloBuilder& b, const Value& seg, int64_t K) {
  const std::vector<int64_t>& d = seg.type().dims;  // [B, T]
  auto as_f32 = [&](const Value& p) { return b.convert(p, kF32); };
  const Value valid_p = b.compare(seg, b.constant({kS32, d}, 0), xla::Compare::kGe);
  // seg[t-1] (t = 0: a value no document has, so token 0 always starts one)
  const Value prev = b.concatenate(
      {b.constant({kS32, {d[0], 1}}, -2147483648.0), b.slice(seg, {0, 0}, {d[0], d[1] - 1})}, 1);
  DocMasks m{as_f32(valid_p), as_f32(b.compare(seg, prev, xla::Compare::kNe)), {}};
  m.start = b.mul(m.start, m.valid);
  const Value not_start = b.sub(full(b, d, 1.0), m.start);
  m.conv.push_back(m.valid);
  for (int64_t s = 1; s < K; ++s)
    m.conv.push_back(
        b.mul(m.conv.back(), b.reshape(shift_time(b, b.reshape(not_start, {d[0], d[1], 1}), s - 1), d)));
  return m;
}

// Causal depthwise conv + SiLU within documents (kda_conv.cpp), IN [N, C], W [C, 1, K]:
//   pre[t,c] = sum_j w[c,j] x[t-K+1+j, c] over sources in t's document (j ascending, as the kernel);
//   y = silu(pre) (pre = 0 on padding, so y = 0 there).
Value conv_pre(HloBuilder& b, const Value& in, const Value& w, const DocMasks& m, const Rows& r) {
  const int64_t C = in.type().dims[1], K = w.type().dims[2], B = r.B(), T = r.T();
  const Value x = to_rows(b, r, in), w2 = b.reshape(w, {C, K});
  std::optional<Value> acc;
  for (int64_t j = 0; j < K; ++j) {
    const int64_t s = K - 1 - j;
    const Value wj = bc(b, b.reshape(b.slice(w2, {0, j}, {C, j + 1}), {C}), {B, T, C}, {2});
    const Value term = b.mul(b.mul(wj, shift_time(b, x, s)), bc(b, m.conv[size_t(s)], {B, T, C}, {0, 1}));
    acc = acc ? b.add(*acc, term) : term;
  }
  return *acc;  // [B, T, C]
}
Value conv_forward(HloBuilder& b, const Value& in, const Value& w, const DocMasks& m, const Rows& r) {
  const Value pre = conv_pre(b, in, w, m, r);
  return from_rows(b, r, b.mul(pre, b.logistic(pre)));
}
// dpre = dy silu'(pre) = dy s (1 + pre (1 - s));  per shift s (j = K-1-s), with m = conv[s]:
//   dx[t - s] += m[t] dpre[t] w[c,j];   dw[c,j] += sum_t m[t] dpre[t] x[t - s]
ConvBackward conv_backward(HloBuilder& b, const Value& in, const Value& w, const DocMasks& m, const Value& dy,
                           const Rows& r) {
  const int64_t C = in.type().dims[1], K = w.type().dims[2];
  const std::vector<int64_t> d3{r.B(), r.T(), C};
  const Value pre = conv_pre(b, in, w, m, r), sg = b.logistic(pre), one = full(b, d3, 1.0);
  const Value dpre = b.mul(b.mul(to_rows(b, r, dy), sg), b.add(one, b.mul(pre, b.sub(one, sg))));
  const Value x = to_rows(b, r, in), w2 = b.reshape(w, {C, K});
  std::optional<Value> dx;
  std::vector<Value> dw_cols;
  for (int64_t j = 0; j < K; ++j) {
    const int64_t s = K - 1 - j;
    const Value md = b.mul(dpre, bc(b, m.conv[size_t(s)], d3, {0, 1}));
    const Value wj = bc(b, b.reshape(b.slice(w2, {0, j}, {C, j + 1}), {C}), d3, {2});
    const Value term = shift_time(b, b.mul(md, wj), -s);
    dx = dx ? b.add(*dx, term) : term;
    dw_cols.push_back(b.reshape(b.reduce_sum(b.mul(md, shift_time(b, x, s)), {0, 1}), {C, 1}));
  }
  return {from_rows(b, r, *dx), b.reshape(b.concatenate(dw_cols, 1), w.type().dims)};
}

// L2 norm of each head (kda_l2norm.cpp), X [N, H*D]:  r = 1 / sqrt(sum x^2 + eps), y = x r;
// backward: dx = r (dy - y (y . dy)).
Value l2norm_forward(HloBuilder& b, const Value& x, int64_t H, int64_t D) {
  const int64_t N = x.type().dims[0];
  const Value x3 = b.reshape(x, {N, H, D});
  const Value ss = b.reduce_sum(b.mul(x3, x3), {2});
  const Value r = b.div(full(b, {N, H}, 1.0), b.sqrt(b.add(ss, full(b, {N, H}, kda::kL2NormEps))));
  return b.reshape(b.mul(x3, bc(b, r, {N, H, D}, {0, 1})), {N, H * D});
}
Value l2norm_backward(HloBuilder& b, const Value& x, const Value& dy, int64_t H, int64_t D) {
  const int64_t N = x.type().dims[0];
  const Value x3 = b.reshape(x, {N, H, D}), dy3 = b.reshape(dy, {N, H, D});
  const Value ss = b.reduce_sum(b.mul(x3, x3), {2}), xdy = b.reduce_sum(b.mul(x3, dy3), {2});
  const Value r = b.div(full(b, {N, H}, 1.0), b.sqrt(b.add(ss, full(b, {N, H}, kda::kL2NormEps))));
  const Value ydy = b.mul(xdy, r);
  const Value rb = bc(b, r, {N, H, D}, {0, 1});
  const Value dx = b.mul(rb, b.sub(dy3, b.mul(b.mul(x3, rb), bc(b, ydy, {N, H, D}, {0, 1}))));
  return b.reshape(dx, {N, H * D});
}

// torch softplus (threshold 20): x > 20 ? x : log1p(exp(x)), with log1p(u) = u log(w) / (w - 1), w = 1 + u
// (exact to a few ulp also where 1 + u rounds to 1, where it is u).
Value softplus(HloBuilder& b, const Value& x) {
  const Value u = b.exp(x), one = b.constant(x.type(), 1.0), w = b.add(one, u);
  const Value l1p =
      b.select(b.compare(w, one, xla::Compare::kEq), u, b.div(b.mul(u, b.log(w)), b.sub(w, one)));
  return b.select(b.compare(x, b.constant(x.type(), 20.0), xla::Compare::kGt), x, l1p);
}

// The gate (kda_gate.cpp), F [N, H*D]:  g = -exp(A_log[h]) softplus(f + dt_bias)  ([N, H, D]).
Value gate_forward(HloBuilder& b, const Value& f, const Value& A_log, const Value& dt_bias, int64_t H,
                   int64_t D) {
  const int64_t N = f.type().dims[0];
  const std::vector<int64_t> d3{N, H, D};
  const Value a = bc(b, b.neg(b.exp(A_log)), d3, {1});
  const Value xx = b.add(b.reshape(f, d3), bc(b, b.reshape(dt_bias, {H, D}), d3, {1, 2}));
  return b.mul(a, softplus(b, xx));
}

// The gated output RMSNorm (kda_gate.cpp), O, Z [N, H, D], W [D]:  r = 1 / sqrt(mean(o^2) + eps),
// y = o r w sigmoid(z).
Value out_norm_forward(HloBuilder& b, const Value& o, const Value& z, const Value& w, double eps, bool silu) {
  const std::vector<int64_t>& d3 = o.type().dims;
  const std::vector<int64_t> d2{d3[0], d3[1]};
  const Value ms = b.div(b.reduce_sum(b.mul(o, o), {2}), full(b, d2, double(d3[2])));
  const Value r = bc(b, b.div(full(b, d2, 1.0), b.sqrt(b.add(ms, full(b, d2, eps)))), d3, {0, 1});
  const Value act = silu ? b.mul(z, b.logistic(z)) : b.logistic(z);
  return b.mul(b.mul(b.mul(o, r), bc(b, w, d3, {2})), act);
}
// nh = o r, a = nh w, y = a s(z):  dz = dy a s (1 - s);  da = dy s;  dw = sum da nh;  dnh = da w;
// do = r (dnh - nh mean(dnh nh)).
OutNormBackward out_norm_backward(HloBuilder& b, const Value& o, const Value& z, const Value& w,
                                  const Value& dy, double eps, bool silu) {
  const std::vector<int64_t>& d3 = o.type().dims;
  const std::vector<int64_t> d2{d3[0], d3[1]};
  const Value ms = b.div(b.reduce_sum(b.mul(o, o), {2}), full(b, d2, double(d3[2])));
  const Value r = bc(b, b.div(full(b, d2, 1.0), b.sqrt(b.add(ms, full(b, d2, eps)))), d3, {0, 1});
  const Value s = b.logistic(z), nh = b.mul(o, r), wb = bc(b, w, d3, {2}), one = full(b, d3, 1.0);
  // sigmoid: act' = s (1 - s);  silu: act = z s, act' = s (1 + z (1 - s))
  const Value dz = silu ? b.mul(b.mul(dy, b.mul(nh, wb)), b.mul(s, b.add(one, b.mul(z, b.sub(one, s)))))
                        : b.mul(b.mul(b.mul(dy, b.mul(nh, wb)), s), b.sub(one, s));
  const Value da = b.mul(dy, silu ? b.mul(z, s) : s), dnh = b.mul(da, wb);
  const Value dot = b.div(b.reduce_sum(b.mul(dnh, nh), {2}), full(b, d2, double(d3[2])));
  const Value dout = b.mul(r, b.sub(dnh, b.mul(nh, bc(b, dot, d3, {0, 1}))));
  return {dout, dz, b.reduce_sum(b.mul(da, nh), {0, 1})};
}

// The delta rule's inputs, time-major ([T, B, H, ...]) for the loops over t:
//   q~ = scale q valid (zero on padding: o = 0 there);  a = exp(g) on a document's inner tokens, 0 at its
//   first token (the state restarts), 1 on padding (no decay);  beta~ = beta valid (no update on padding).
DeltaInputs delta_inputs(HloBuilder& b, const DocMasks& m, const Value& qn, const Value& kn, const Value& vc,
                         const Value& g, const Value& beta, const Rows& r, int64_t H, int64_t Dk, int64_t Dv,
                         double scale) {
  using xla::Logical;
  const int64_t B = r.B(), T = r.T();
  OLMO_CHECK(H % r.S == 0, "the delta rule's ", H,
             " heads do not split over the mesh's expert x context = ", r.S,
             " (each device runs whole rows of its heads)");
  auto tm = [&](const Value& x, int64_t D) { return time_major(b, r, x, H, D); };
  const std::vector<int64_t> dk{T, B, H, Dk};
  const Value valid = b.transpose(m.valid, {1, 0}), start = b.transpose(m.start, {1, 0});
  const Value vk = bc(b, valid, dk, {0, 1});
  const Value keep = bc(b, b.mul(valid, b.sub(full(b, {T, B}, 1.0), start)), dk, {0, 1});
  DeltaInputs in{b.mul(b.mul(tm(qn, Dk), full(b, dk, scale)), vk),
                 tm(kn, Dk),
                 tm(vc, Dv),
                 vk,
                 vk,
                 vk,
                 start,
                 B,
                 T,
                 H,
                 Dk,
                 Dv,
                 r};
  in.a = b.add(b.mul(b.exp(tm(b.reshape(g, {B * T, H * Dk}), Dk)), keep), b.sub(full(b, dk, 1.0), vk));
  in.beta = b.mul(b.reshape(tm(beta, 1), {T, B, H}), bc(b, valid, {T, B, H}, {0, 1}));
  in.lg = b.mul(tm(b.reshape(g, {B * T, H * Dk}), Dk), keep);
  in.start = start;
  return in;
}

// X [T, ...] at time I (s32 scalar): X[I] without the time dimension.
Value at_time(HloBuilder& b, const Value& x, const Value& i) {
  std::vector<int64_t> sizes = x.type().dims;
  std::vector<Value> starts{i};
  for (size_t j = 1; j < sizes.size(); ++j) starts.push_back(b.constant({kS32, {}}, 0));
  sizes[0] = 1;
  const Value s = b.dynamic_slice(x, starts, sizes);
  return b.reshape(s, std::vector<int64_t>(sizes.begin() + 1, sizes.end()));
}
// X [T, ...] with X[I] = V.
Value put_time(HloBuilder& b, const Value& x, const Value& v, const Value& i) {
  std::vector<Value> starts{i};
  std::vector<int64_t> d = v.type().dims;
  for (size_t j = 0; j < d.size(); ++j) starts.push_back(b.constant({kS32, {}}, 0));
  d.insert(d.begin(), 1);
  return b.dynamic_update_slice(x, b.reshape(v, d), starts);
}

// One step's decayed state and delta (kda_recurrent.cpp), S [B, H, Dk, Dv] the state before token t:
//   S' = Diag(a_t) S;  r = v_t - S'^T k_t;  u = beta_t r;  S_t = S' + k_t u^T
struct DeltaStep {
  Value Sp, r, u, St;
};
DeltaStep delta_step(HloBuilder& b, const DeltaInputs& in, const Value& S, const Value& i) {
  const std::vector<int64_t> ds{in.B, in.H, in.Dk, in.Dv}, dv{in.B, in.H, in.Dv};
  const xla::DotDims contract_k{{0, 1}, {0, 1}, {2}, {2}};  // [B, H, Dk, Dv] . [B, H, Dk] -> [B, H, Dv]
  const Value k = at_time(b, in.k, i);
  DeltaStep st{b.mul(S, bc(b, at_time(b, in.a, i), ds, {0, 1, 2})), S, S, S};
  st.r = b.sub(at_time(b, in.v, i), b.dot_general(st.Sp, k, contract_k));
  st.u = b.mul(bc(b, at_time(b, in.beta, i), dv, {0, 1}), st.r);
  st.St = b.add(st.Sp, b.mul(bc(b, k, ds, {0, 1, 2}), bc(b, st.u, ds, {0, 1, 3})));
  return st;
}

// The delta rule within documents, token by token: a while loop over t carrying the state S [B, H, Dk, Dv];
// o_t = S_t^T q~_t. Returns o [N, H*Dv].
Value delta_forward(HloBuilder& b, const DeltaInputs& in) {
  const xla::DotDims contract_k{{0, 1}, {0, 1}, {2}, {2}};
  const std::vector<Value> out = b.for_loop(
      in.T, {full(b, {in.B, in.H, in.Dk, in.Dv}, 0.0), full(b, {in.T, in.B, in.H, in.Dv}, 0.0)},
      [&](HloBuilder& lb, const Value& i, const std::vector<Value>& c) -> std::vector<Value> {
        const DeltaStep st = delta_step(lb, in, c[0], i);
        const Value o = lb.dot_general(st.St, at_time(lb, in.q, i), contract_k);
        return {st.St, put_time(lb, c[1], o, i)};
      },
      xla::kDeltaRuleLoop);
  return from_rows(b, in.rows, b.reshape(b.transpose(out[1], {1, 0, 2, 3}), {in.B, in.T, in.H * in.Dv}));
}

// X [T, ...] extended to TP tokens with the value V (the time-major inputs of padding tokens: no-ops).
Value pad_time(HloBuilder& b, const Value& x, int64_t tp, double v) {
  const int64_t t = x.type().dims[0];
  if (tp == t) return x;
  return b.concatenate({x, b.constant({x.type().type, with_dim(x.type().dims, 0, tp - t)}, v)}, 0);
}

// One step of the reverse-time recurrence (docs/reference/architecture.md C.2, kda_recurrent_backward) at
// token T, SPREV the state before it, C = {G, dq, dk, dv, dg, dbeta} with G = dL/dS_t:
//   G += q~_t do_t^T;  dq = scale S_t do_t;  du = G^T k;  dv = beta du;  dbeta = r . du;
//   dk = G u - beta S' du;  dS' = G - beta k du^T;  dg = rowsum(dS' . S');  G <- Diag(a_t) dS'
std::vector<Value> reverse_step(HloBuilder& lb, const DeltaInputs& in, const Value& dOt, const Value& Sprev,
                                const Value& t, const std::vector<Value>& c, double scale) {
  const int64_t B = in.B, H = in.H, Dk = in.Dk, Dv = in.Dv;
  const std::vector<int64_t> ds{B, H, Dk, Dv};
  const xla::DotDims contract_k{{0, 1}, {0, 1}, {2}, {2}}, contract_v{{0, 1}, {0, 1}, {3}, {2}};
  const DeltaStep st = delta_step(lb, in, Sprev, t);
  const Value q = at_time(lb, in.q, t), k = at_time(lb, in.k, t), dot = at_time(lb, dOt, t);
  const Value bt = at_time(lb, in.beta, t), btv = bc(lb, bt, {B, H, Dv}, {0, 1});
  const Value G = lb.add(c[0], lb.mul(bc(lb, q, ds, {0, 1, 2}), bc(lb, dot, ds, {0, 1, 3})));
  const Value dq = lb.mul(lb.dot_general(st.St, dot, contract_v), lb.constant({kF32, {B, H, Dk}}, scale));
  const Value du = lb.dot_general(G, k, contract_k);
  const Value dv = lb.mul(btv, du), db = lb.reduce_sum(lb.mul(st.r, du), {2});
  const Value dk = lb.sub(lb.dot_general(G, st.u, contract_v),
                          lb.mul(bc(lb, bt, {B, H, Dk}, {0, 1}), lb.dot_general(st.Sp, du, contract_v)));
  const Value dSp = lb.sub(G, lb.mul(bc(lb, lb.mul(btv, du), ds, {0, 1, 3}), bc(lb, k, ds, {0, 1, 2})));
  const Value dg = lb.reduce_sum(lb.mul(dSp, st.Sp), {3});
  const Value Gn = lb.mul(bc(lb, at_time(lb, in.a, t), ds, {0, 1, 2}), dSp);
  return {Gn,
          put_time(lb, c[1], dq, t),
          put_time(lb, c[2], dk, t),
          put_time(lb, c[3], dv, t),
          put_time(lb, c[4], dg, t),
          put_time(lb, c[5], db, t)};
}

// The delta rule's backward: the reverse-time recurrence from t = T-1 down to 0, with the states recomputed
// from checkpoints (as kda_recurrent_backward): one forward loop keeps the state before each block of CKPT
// tokens; then per block, last first, an inner loop recomputes the block's CKPT states and a reverse inner
// loop runs the steps. Memory: ceil(T / CKPT) + CKPT states of [B, H, Dk, Dv]. T is padded to whole blocks
// with padding tokens (no-ops). dbeta and dg are masked to zero on padding; dq, dk, dv are zero there
// already (do~ = do valid, beta~ = 0).
DeltaGrads delta_backward(HloBuilder& b, const DeltaInputs& in0, const DocMasks& m, const Value& dO,
                          double scale, int64_t ckpt) {
  const int64_t B = in0.B, T = in0.T, H = in0.H, Dk = in0.Dk, Dv = in0.Dv;
  const int64_t C = std::max<int64_t>(1, std::min(ckpt, T)), nb = (T + C - 1) / C, Tp = nb * C;
  const std::vector<int64_t> ds{B, H, Dk, Dv}, tk{Tp, B, H, Dk}, tv{Tp, B, H, Dv};
  const Value valid = b.transpose(m.valid, {1, 0});
  const Value dOt =
      pad_time(b, b.mul(time_major(b, in0.rows, dO, H, Dv), bc(b, valid, {T, B, H, Dv}, {0, 1})), Tp, 0.0);
  DeltaInputs in = in0;
  in.T = Tp;
  in.q = pad_time(b, in0.q, Tp, 0.0);
  in.k = pad_time(b, in0.k, Tp, 0.0);
  in.v = pad_time(b, in0.v, Tp, 0.0);
  in.a = pad_time(b, in0.a, Tp, 1.0);
  in.beta = pad_time(b, in0.beta, Tp, 0.0);
  auto token = [C](HloBuilder& lb, const Value& ib, const Value& j) {
    return lb.add(lb.mul(ib, lb.constant({kS32, {}}, double(C))), j);
  };
  // The states before block IB's tokens ([C, B, H, Dk, Dv]) from the state S0 before the block.
  auto block_states = [&](HloBuilder& lb, const Value& ib, const Value& S0) {
    return lb.for_loop(
        C, {S0, full(lb, {C, B, H, Dk, Dv}, 0.0)},
        [&](HloBuilder& l2, const Value& j, const std::vector<Value>& c) -> std::vector<Value> {
          return {delta_step(l2, in, c[0], token(l2, ib, j)).St, put_time(l2, c[1], c[0], j)};
        },
        xla::kDeltaRuleLoop);
  };
  // ck[ib]: the state before block ib
  const Value ck = b.for_loop(
      nb, {full(b, ds, 0.0), full(b, {nb, B, H, Dk, Dv}, 0.0)},
      [&](HloBuilder& lb, const Value& ib, const std::vector<Value>& c) {
        const std::vector<Value> r = block_states(lb, ib, c[0]);
        return std::vector<Value>{r[0], put_time(lb, c[1], c[0], ib)};
      },
      xla::kDeltaRuleLoop)[1];
  const std::vector<Value> r = b.for_loop(
      nb,
      {full(b, ds, 0.0), full(b, tk, 0.0), full(b, tk, 0.0), full(b, tv, 0.0), full(b, tk, 0.0),
       full(b, {Tp, B, H}, 0.0)},
      [&](HloBuilder& lb, const Value& i, const std::vector<Value>& c) {
        const Value ib = lb.sub(lb.constant({kS32, {}}, double(nb - 1)), i);
        const Value states = block_states(lb, ib, at_time(lb, ck, ib))[1];
        return lb.for_loop(C, c, [&](HloBuilder& l2, const Value& jj, const std::vector<Value>& c2) {
          const Value j = l2.sub(l2.constant({kS32, {}}, double(C - 1)), jj);
          return reverse_step(l2, in, dOt, at_time(l2, states, j), token(l2, ib, j), c2, scale);
        });
      },
      xla::kDeltaRuleLoop);
  auto first = [&](const Value& x) {  // [Tp, ...] -> [T, ...]
    return b.slice(x, std::vector<int64_t>(x.type().dims.size(), 0), with_dim(x.type().dims, 0, T));
  };
  auto flat = [&](const Value& x, int64_t D) {  // [T, B, H, D] -> [N, H*D]
    return from_rows(b, in0.rows, b.reshape(b.transpose(x, {1, 0, 2, 3}), {B, T, H * D}));
  };
  const Value vk = bc(b, valid, {T, B, H, Dk}, {0, 1}), vh = bc(b, valid, {T, B, H}, {0, 1});
  return {flat(first(r[1]), Dk), flat(first(r[2]), Dk), flat(first(r[3]), Dv),
          flat(b.mul(first(r[4]), vk), Dk),
          from_rows(b, in0.rows, b.transpose(b.mul(first(r[5]), vh), {1, 0, 2}))};
}

Value delta_rule_forward(HloBuilder& b, const DeltaInputs& in, int64_t chunk) {
  return chunk > 0 ? delta_chunk_forward(b, in, chunk) : delta_forward(b, in);
}
DeltaGrads delta_rule_backward(HloBuilder& b, const DeltaInputs& in, const DocMasks& m, const Value& dO,
                               double scale, int64_t chunk, int64_t ckpt) {
  return chunk > 0 ? delta_chunk_backward(b, in, m, dO, scale, chunk)
                   : delta_backward(b, in, m, dO, scale, ckpt);
}

}  // namespace olmosft::model::unit::delta_emit
