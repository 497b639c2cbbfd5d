// The chunked (WY / UT) delta rule as StableHLO (delta_rule_emit.h; docs/kda.md "Chunked algorithm",
// docs/xla.md "The delta rule on XLA"). Per (row, head) and chunk of C tokens, with Γ the chunk's cumulative
// log decay (in-chunk, within the document: Γ_i sums lg over i's document's tokens of the chunk up to i),
// E_ij = exp(Γ_i - Γ_j) for j <= i in i's document (0 otherwise), cont_i = 1 while no document has started in
// the chunk up to i (the incoming state still applies), last_j = j is in the chunk's last document:
//   P_ij = Σ_c k_i k_j E_ij (j < i);   Aqk_ij = Σ_c q~_i k_j E_ij (j <= i);   M = I + Diag(β) P
//   eG = exp(Γ) cont;  [W | U] = M^-1 Diag(β) [K eG | V] (a triangular solve);  Ṽ = U - W S
//   O = (Q~ eG) S + Aqk Ṽ;   S <- Diag(exp(Γ_last) cont_last) S + (K exp(Γ_last - Γ) last)^T Ṽ
// Every exponent is <= 0 (Γ never increases), so nothing overflows whatever the decay; a masked pair's
// exponent is replaced by 0 and its factor by an exact 0 after the exp (XLA's exp clamps its input, so
// exp(-huge) is not 0: another document's tokens in the chunk would move the last bits). Padding tokens are
// no-ops (β = 0, q~ = 0, no decay), as are the tokens that fill the last chunk. Tensors of all chunks are
// [NC, B, H, C, D]; a chunk's [B, H, C, D] (the "lead" dimensions before C are batch dimensions of every
// product).
#include <algorithm>

#include "model/delta_rule_emit.h"
#include "xla/hlo_loops.h"

namespace olmosft::model::unit::delta_emit {

namespace {

constexpr xla::ElementType kF32 = xla::ElementType::kF32;
constexpr xla::ElementType kS32 = xla::ElementType::kS32;

std::vector<int64_t> iota_dims(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 0; i < n; ++i) d.push_back(i);
  return d;
}
// D with V appended.
std::vector<int64_t> plus(std::vector<int64_t> d, std::initializer_list<int64_t> v) {
  d.insert(d.end(), v);
  return d;
}
// A batched product over the first NL dimensions, contracting X's dimension CX with Y's CY.
Value bdot(HloBuilder& b, const Value& x, const Value& y, int64_t cx, int64_t cy, int64_t nl) {
  return b.dot_general(x, y, xla::DotDims{iota_dims(nl), iota_dims(nl), {cx}, {cy}});
}
// [C, C] f32 0/1: 1 where row r <= column c (UPPER) or r >= c.
Value triangle(HloBuilder& b, int64_t C, bool upper) {
  const Value r = b.iota({kS32, {C, C}}, 0), c = b.iota({kS32, {C, C}}, 1);
  return b.convert(b.compare(r, c, upper ? xla::Compare::kLe : xla::Compare::kGe), kF32);
}
// Γ_i = Σ_t INCL[i, t] lg_t over i's own document up to i (INCL [L, C, C], LG [L, C, Dk]), so that another
// document's decays in the chunk do not enter (nor round) it; REVERSE: its adjoint Σ_i INCL[i, t] dΓ_i.
Value doc_cumsum(HloBuilder& b, const Value& incl, const Value& x, bool reverse) {
  const int64_t nl = int64_t(x.type().dims.size()) - 2;
  return bdot(b, reverse ? b.transpose(incl, plus(iota_dims(nl), {nl + 1, nl})) : incl, x, nl + 1, nl, nl);
}

// The inputs cut into chunks, with the documents' masks.
struct Chunks {
  Value q, k, v, beta, gam;   // [L, C, Dk] / [L, C, Dv] / [L, C]; gam = Γ [L, C, Dk]
  Value incl, strict;         // [L, C, C]: j <= i (j < i) in i's document
  Value cont, last;           // [L, C]
  std::vector<int64_t> lead;  // L: [NC, B, H] (all chunks) or [B, H] (one)
};

// X [T, B, H, D] (time-major) as chunks of C tokens [NC, B, H, C, D], padded with PAD.
Value to_chunks(HloBuilder& b, const Value& x, int64_t C, double pad) {
  const std::vector<int64_t>& d = x.type().dims;
  const int64_t NC = (d[0] + C - 1) / C;
  return b.transpose(b.reshape(pad_time(b, x, NC * C, pad), {NC, C, d[1], d[2], d[3]}), {0, 2, 3, 1, 4});
}

// DeltaInputs (time-major [T, B, H, D]) as chunks of C tokens, [NC, B, H, C, D].
Chunks cut(HloBuilder& b, const DeltaInputs& in, int64_t C) {
  const int64_t B = in.B, H = in.H, NC = (in.T + C - 1) / C, Tp = NC * C;
  auto chunks = [&](const Value& x, double pad) { return to_chunks(b, x, C, pad); };
  // cnt_i: documents started in the chunk up to i; same document <=> equal counts (documents are runs)
  // (an exact sum of 0 / 1 values)
  const Value cnt =
      b.cumsum(b.transpose(b.reshape(pad_time(b, in.start, Tp, 0.0), {NC, C, B}), {0, 2, 1}), 2);
  const std::vector<int64_t> d3{NC, B, C}, d4{NC, B, C, C}, l4{NC, B, H, C}, l5{NC, B, H, C, C};
  const Value same =
      b.convert(b.compare(bc(b, cnt, d4, {0, 1, 2}), bc(b, cnt, d4, {0, 1, 3}), xla::Compare::kEq), kF32);
  const Value incl = bc(b, b.mul(same, bc(b, triangle(b, C, false), d4, {2, 3})), l5, {0, 1, 3, 4});
  const Value strict = b.mul(incl, bc(b, b.sub(full(b, {C, C}, 1.0), triangle(b, C, true)), l5, {3, 4}));
  const Value cl = bc(b, b.reshape(b.slice(cnt, {0, 0, C - 1}, {NC, B, C}), {NC, B}), d3, {0, 1});
  return {chunks(in.q, 0.0),
          chunks(in.k, 0.0),
          chunks(in.v, 0.0),
          b.transpose(b.reshape(pad_time(b, in.beta, Tp, 0.0), {NC, C, B, H}), {0, 2, 3, 1}),
          doc_cumsum(b, incl, chunks(in.lg, 0.0), false),
          incl,
          strict,
          bc(b, b.convert(b.compare(cnt, full(b, d3, 0.0), xla::Compare::kEq), kF32), l4, {0, 1, 3}),
          bc(b, b.convert(b.compare(cnt, cl, xla::Compare::kEq), kF32), l4, {0, 1, 3}),
          {NC, B, H}};
}

// One chunk of a Chunks (lead [B, H]) at chunk index I of the all-chunks arrays.
Chunks at_chunk(HloBuilder& b, const Chunks& a, const Value& i) {
  return {at_time(b, a.q, i),      at_time(b, a.k, i),
          at_time(b, a.v, i),      at_time(b, a.beta, i),
          at_time(b, a.gam, i),    at_time(b, a.incl, i),
          at_time(b, a.strict, i), at_time(b, a.cont, i),
          at_time(b, a.last, i),   std::vector<int64_t>(a.lead.begin() + 1, a.lead.end())};
}

// E [L, C, C, Dk] = exp(Γ_i - Γ_j) where MASK [L, C, C] (else 0).
Value pair_decay(HloBuilder& b, const Value& gam, const Value& mask) {
  const int64_t nl = int64_t(gam.type().dims.size()) - 2, C = gam.type().dims[size_t(nl)],
                Dk = gam.type().dims[size_t(nl) + 1];
  std::vector<int64_t> li = iota_dims(nl);
  const std::vector<int64_t> lead(gam.type().dims.begin(), gam.type().dims.begin() + nl);
  const std::vector<int64_t> d = plus(lead, {C, C, Dk});
  const Value gi = bc(b, gam, d, plus(li, {nl, nl + 2})), gj = bc(b, gam, d, plus(li, {nl + 1, nl + 2}));
  const Value on = b.compare(bc(b, mask, d, plus(li, {nl, nl + 1})), full(b, d, 0.5), xla::Compare::kGt);
  const Value zero = full(b, d, 0.0);
  return b.select(on, b.exp(b.select(on, b.sub(gi, gj), zero)), zero);
}

// What the forward's state loop and the backward read per chunk.
struct Factors {
  Value p, aqk;  // [L, C, C]: P (strict), Aqk (inclusive)
  Value minv;    // [L, C, C]: M^-1 (unit lower triangular)
  Value wu;      // [L, C, Dk + Dv]: [W | U]
  Value eg, qg;  // [L, C, Dk]: exp(Γ) cont, Q~ eG
  Value el, kl;  // [L, C, Dk]: exp(Γ_last - Γ) last, K el
  Value dec;     // [L, Dk]: exp(Γ_last) cont_last
};

Factors factors(HloBuilder& b, const Chunks& c) {
  const int64_t nl = int64_t(c.lead.size()), C = c.q.type().dims[size_t(nl)],
                Dk = c.q.type().dims[size_t(nl) + 1];
  const std::vector<int64_t> li = iota_dims(nl), dk = plus(c.lead, {C, Dk}), lc = plus(c.lead, {C});
  const Value E = pair_decay(b, c.gam, c.incl);
  // P and Aqk in one reduction over c (E read once): [K; Q~]_i k_j E_ij
  const std::vector<int64_t> d2 = plus(c.lead, {2, C, C, Dk});
  const Value kq =
      b.concatenate({b.reshape(c.k, plus(c.lead, {1, C, Dk})), b.reshape(c.q, plus(c.lead, {1, C, Dk}))}, nl);
  const Value pa = b.reduce_sum(
      b.mul(b.mul(bc(b, kq, d2, plus(li, {nl, nl + 1, nl + 3})), bc(b, c.k, d2, plus(li, {nl + 2, nl + 3}))),
            bc(b, E, d2, plus(li, {nl + 1, nl + 2, nl + 3}))),
      {nl + 3});
  const std::vector<int64_t> cc = plus(c.lead, {C, C}), z(size_t(nl + 3), 0);
  const Value p = b.mul(b.reshape(b.slice(pa, z, plus(c.lead, {1, C, C})), cc), c.strict);
  const Value aqk =
      b.mul(b.reshape(b.slice(pa, with_dim(z, size_t(nl), 1), plus(c.lead, {2, C, C})), cc), c.incl);
  const Value eg = b.mul(b.exp(c.gam), bc(b, c.cont, dk, plus(li, {nl})));
  const Value bk = bc(b, c.beta, dk, plus(li, {nl}));
  const Value bv = bc(b, c.beta, plus(c.lead, {C, c.v.type().dims[size_t(nl) + 1]}), plus(li, {nl}));
  const Value a = b.mul(bc(b, c.beta, cc, plus(li, {nl})), p);  // strict lower Diag(β) P
  // [W | U] by one batched solve (outside every loop). The backward's adjoint solve runs inside its loop,
  // where the partitioner would replicate a triangular_solve (two all-gathers per chunk, measured) but splits
  // a dot_general by its batch dimensions: it is a product with M^-1, solved here against I (an explicit
  // inverse also for the forward measured 2x the solve's error on Gated DeltaNet with beta up to 2)
  const Value wu = b.triangular_solve(a, b.concatenate({b.mul(bk, b.mul(c.k, eg)), b.mul(bv, c.v)}, nl + 1),
                                      true, true, false);
  const Value id =
      b.convert(b.compare(b.iota({kS32, {C, C}}, 0), b.iota({kS32, {C, C}}, 1), xla::Compare::kEq), kF32);
  const Value minv = b.triangular_solve(a, bc(b, id, cc, {nl, nl + 1}), true, true, false);
  std::vector<int64_t> lo(size_t(nl + 2), 0);
  const Value gl = b.reshape(b.slice(c.gam, with_dim(lo, size_t(nl), C - 1), dk), plus(c.lead, {Dk}));
  const Value on = b.compare(bc(b, c.last, dk, plus(li, {nl})), full(b, dk, 0.5), xla::Compare::kGt);
  const Value el =
      b.select(on, b.exp(b.select(on, b.sub(bc(b, gl, dk, plus(li, {nl + 1})), c.gam), full(b, dk, 0.0))),
               full(b, dk, 0.0));
  const Value cl = b.reshape(
      b.slice(c.cont, with_dim(std::vector<int64_t>(size_t(nl + 1), 0), size_t(nl), C - 1), lc), c.lead);
  return {p,
          aqk,
          minv,
          wu,
          eg,
          b.mul(c.q, eg),
          el,
          b.mul(c.k, el),
          b.mul(b.exp(gl), bc(b, cl, plus(c.lead, {Dk}), li))};
}

// One chunk's factors (lead [B, H]) from the all-chunks ones.
Factors factors_at(HloBuilder& b, const Factors& f, const Value& i) {
  return {at_time(b, f.p, i),  at_time(b, f.aqk, i), at_time(b, f.minv, i),
          at_time(b, f.wu, i), at_time(b, f.eg, i),  at_time(b, f.qg, i),
          at_time(b, f.el, i), at_time(b, f.kl, i),  at_time(b, f.dec, i)};
}

// W and U of [W | U] [B, H, C, Dk + Dv].
Value w_of(HloBuilder& b, const Value& wu, int64_t Dk) {
  const std::vector<int64_t>& d = wu.type().dims;
  return b.slice(wu, std::vector<int64_t>(d.size(), 0), with_dim(d, d.size() - 1, Dk));
}
Value u_of(HloBuilder& b, const Value& wu, int64_t Dk) {
  const std::vector<int64_t>& d = wu.type().dims;
  return b.slice(wu, with_dim(std::vector<int64_t>(d.size(), 0), d.size() - 1, Dk), d);
}

// One chunk forward from the state S [B, H, Dk, Dv]: Ṽ, O and the state after it.
struct ChunkStep {
  Value vt, o, s;
};
ChunkStep chunk_step(HloBuilder& b, const Factors& f, const Value& S, int64_t Dk) {
  const Value vt = b.sub(u_of(b, f.wu, Dk), bdot(b, w_of(b, f.wu, Dk), S, 3, 2, 2));
  return {vt, b.add(bdot(b, f.qg, S, 3, 2, 2), bdot(b, f.aqk, vt, 3, 2, 2)),
          b.add(b.mul(bc(b, f.dec, S.type().dims, {0, 1, 2}), S), bdot(b, f.kl, vt, 2, 2, 2))};
}

// [NC, B, H, C, D] (or [NC, B, H, C]) as whole rows [B, T, H*D] ([B, T, H]), the first T tokens.
Value row_view(HloBuilder& b, const Value& x, int64_t T) {
  const std::vector<int64_t>& d = x.type().dims;
  const int64_t NC = d[0], B = d[1], H = d[2], C = d[3], D = d.size() > 4 ? d[4] : 1;
  const Value y = d.size() > 4 ? b.transpose(x, {1, 0, 3, 2, 4}) : b.transpose(x, {1, 0, 3, 2});
  return b.slice(b.reshape(y, {B, NC * C, H * D}), {0, 0, 0}, {B, T, H * D});
}

// One chunk's backward (lead [B, H]) from the state S entering it, its pseudo-values VT, DO [B, H, C, Dv]
// and DS = dL/d(the state after it): the gradients of q~, k, v, β and the log decay lg, and dL/dS.
struct ChunkGrads {
  Value dq, dk, dv, dbeta, dlg, ds;
};
ChunkGrads chunk_backward(HloBuilder& b, const Chunks& c, const Factors& f, const Value& S, const Value& vt,
                          const Value& dO, const Value& dS) {
  const std::vector<int64_t>& dk4 = c.k.type().dims;  // [B, H, C, Dk]
  const int64_t B = dk4[0], H = dk4[1], C = dk4[2], Dk = dk4[3], Dv = c.v.type().dims[3];
  const std::vector<int64_t> cc{B, H, C, C}, d5{B, H, C, C, Dk};
  const Value W = w_of(b, f.wu, Dk);
  // O = Qg S + Aqk Ṽ;  S' = Diag(dec) S + Kl^T Ṽ;  Ṽ = U - W S
  const Value dvt = b.add(bdot(b, f.aqk, dO, 2, 2, 2), bdot(b, f.kl, dS, 3, 2, 2));
  const Value daqk = b.mul(bdot(b, dO, vt, 3, 3, 2), c.incl);
  const Value dqg = bdot(b, dO, S, 3, 3, 2), dkl = bdot(b, vt, dS, 3, 3, 2);
  const Value ds_in =
      b.sub(b.add(bdot(b, f.qg, dO, 2, 2, 2), b.mul(bc(b, f.dec, S.type().dims, {0, 1, 2}), dS)),
            bdot(b, W, dvt, 2, 2, 2));
  const Value ddec = b.reduce_sum(b.mul(S, dS), {3});
  // [W | U] = M^-1 R, R = Diag(β) [Kg | V]:  dR = M^-T [dW | dU],  dM = -dR [W | U]^T (strict lower)
  const Value dr = bdot(b, f.minv, b.concatenate({b.neg(bdot(b, dvt, S, 3, 3, 2)), dvt}, 3), 2, 2, 2);
  const Value dm = b.mul(b.neg(bdot(b, dr, f.wu, 3, 3, 2)), c.strict);
  const Value drw = w_of(b, dr, Dk), dru = u_of(b, dr, Dk), kg = b.mul(c.k, f.eg);
  const Value bk = bc(b, c.beta, dk4, {0, 1, 2}), bv = bc(b, c.beta, {B, H, C, Dv}, {0, 1, 2});
  const Value dbeta = b.add(b.add(b.reduce_sum(b.mul(drw, kg), {3}), b.reduce_sum(b.mul(dru, c.v), {3})),
                            b.reduce_sum(b.mul(dm, f.p), {3}));
  const Value dp = b.mul(bc(b, c.beta, cc, {0, 1, 2}), dm), dkg = b.mul(bk, drw);
  // Kg = K eG, Qg = Q~ eG, eG = exp(Γ) cont;  Kl = K el, el = exp(Γ_last - Γ) last;  dec = exp(Γ_last) ...
  Value dk = b.add(b.mul(dkg, f.eg), b.mul(dkl, f.el)), dq = b.mul(dqg, f.eg);
  const Value t = b.mul(b.mul(dkl, c.k), f.el);
  Value dgam = b.sub(b.mul(b.add(b.mul(dkg, c.k), b.mul(dqg, c.q)), f.eg), t);
  const Value dgl = b.add(b.reduce_sum(t, {2}), b.mul(ddec, f.dec));  // [B, H, Dk], onto Γ_last
  const Value at_last = b.convert(
      b.compare(b.iota({kS32, {C}}, 0), b.constant({kS32, {C}}, double(C - 1)), xla::Compare::kEq), kF32);
  dgam = b.add(dgam, b.mul(bc(b, dgl, dk4, {0, 1, 3}), bc(b, at_last, dk4, {2})));
  // the pairwise terms P_ij = Σ_c k_i k_j E_ij, Aqk_ij = Σ_c q~_i k_j E_ij:
  //   X = k_j E;  G = (dP k_i + dAqk q~_i) E;  F = G k_j:  dk_i += dP X, dq_i += dAqk X (sums over j),
  //   dk_j += Σ_i G;  dΓ_i += Σ_j F;  dΓ_j -= Σ_i F
  const Value E = pair_decay(b, c.gam, c.incl);
  const Value kj = bc(b, c.k, d5, {0, 1, 3, 4}), X = b.mul(E, kj);
  const Value dpb = bc(b, dp, d5, {0, 1, 2, 3}), dab = bc(b, daqk, d5, {0, 1, 2, 3});
  dk = b.add(dk, b.reduce_sum(b.mul(dpb, X), {3}));
  dq = b.add(dq, b.reduce_sum(b.mul(dab, X), {3}));
  const Value G =
      b.mul(b.add(b.mul(dpb, bc(b, c.k, d5, {0, 1, 2, 4})), b.mul(dab, bc(b, c.q, d5, {0, 1, 2, 4}))), E);
  const Value F = b.mul(G, kj);
  dgam = b.add(dgam, b.sub(b.reduce_sum(F, {3}), b.reduce_sum(F, {2})));
  // Γ_i = Σ_{t <= i} lg_t
  return {dq,    b.add(dk, b.reduce_sum(G, {2})),   b.mul(bv, dru),
          dbeta, doc_cumsum(b, c.incl, dgam, true), ds_in};
}

// A loop's carried values laid out on the mesh as the inputs are (rows over data x fsdp, heads over expert x
// context): the state [B, H, Dk, Dv] (FIRST values) and the per-chunk arrays [NC, B, H, ...] (the rest).
// Without this the partitioner keeps a carried zero replicated and gathers every chunk's sharded slice into
// it inside the loop (measured: two all-gathers per iteration under fsdp 2).
std::vector<Value> laid(HloBuilder& b, const Rows& r, std::vector<Value> xs, size_t states) {
  using xla::Logical;
  for (size_t i = 0; i < xs.size(); ++i) {
    std::vector<Logical> l(xs[i].type().dims.size(), Logical::kNone);
    const size_t at = i < states ? 0 : 1;  // where B sits
    l[at] = Logical::kRows, l[at + 1] = Logical::kHeads;
    xs[i] = lay_out(b, r, xs[i], l);
  }
  return xs;
}

// Every chunk's inputs, masks and factors laid out as the loops slice them ([NC, B, H, ...]: rows over data x
// fsdp, heads over expert x context), so that a chunk's slice inside a loop is each device's own.
Chunks laid(HloBuilder& b, const Rows& r, const Chunks& c) {
  const std::vector<Value> v =
      laid(b, r, {c.q, c.k, c.v, c.beta, c.gam, c.incl, c.strict, c.cont, c.last}, 0);
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], c.lead};
}
Factors laid(HloBuilder& b, const Rows& r, const Factors& f) {
  const std::vector<Value> v = laid(b, r, {f.p, f.aqk, f.minv, f.wu, f.eg, f.qg, f.el, f.kl, f.dec}, 0);
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
}

}  // namespace

Value delta_chunk_forward(HloBuilder& b, const DeltaInputs& in, int64_t chunk) {
  const int64_t C = std::max<int64_t>(1, chunk), NC = (in.T + C - 1) / C;
  const Chunks c = laid(b, in.rows, cut(b, in, C));
  const Factors f = laid(b, in.rows, factors(b, c));
  const std::vector<Value> out = b.for_loop(
      NC,
      laid(b, in.rows, {full(b, {in.B, in.H, in.Dk, in.Dv}, 0.0), full(b, {NC, in.B, in.H, C, in.Dv}, 0.0)},
           1),
      [&](HloBuilder& lb, const Value& i, const std::vector<Value>& s) -> std::vector<Value> {
        const ChunkStep st = chunk_step(lb, factors_at(lb, f, i), s[0], in.Dk);
        return laid(lb, in.rows, {st.s, put_time(lb, s[1], st.o, i)}, 1);
      },
      xla::kDeltaRuleLoop);
  return from_rows(b, in.rows, row_view(b, out[1], in.T));
}

}  // namespace olmosft::model::unit::delta_emit

namespace olmosft::model::unit::delta_emit {

DeltaGrads delta_chunk_backward(HloBuilder& b, const DeltaInputs& in, const DocMasks& m, const Value& dO,
                                double scale, int64_t chunk) {
  const int64_t B = in.B, T = in.T, H = in.H, Dk = in.Dk, Dv = in.Dv;
  const int64_t C = std::max<int64_t>(1, chunk), NC = (T + C - 1) / C;
  const Chunks c = laid(b, in.rows, cut(b, in, C));
  const Factors f = laid(b, in.rows, factors(b, c));
  const Value dOc = to_chunks(b, time_major(b, in.rows, dO, H, Dv), C, 0.0);
  const std::vector<int64_t> ds{B, H, Dk, Dv}, ck{NC, B, H, C, Dk}, cv{NC, B, H, C, Dv};
  // the state entering each chunk, and each chunk's pseudo-values
  const std::vector<Value> fw = b.for_loop(
      NC, laid(b, in.rows, {full(b, ds, 0.0), full(b, {NC, B, H, Dk, Dv}, 0.0), full(b, cv, 0.0)}, 1),
      [&](HloBuilder& lb, const Value& i, const std::vector<Value>& s) -> std::vector<Value> {
        const ChunkStep st = chunk_step(lb, factors_at(lb, f, i), s[0], Dk);
        return laid(lb, in.rows, {st.s, put_time(lb, s[1], s[0], i), put_time(lb, s[2], st.vt, i)}, 1);
      },
      xla::kDeltaRuleLoop);
  const std::vector<Value> r = b.for_loop(
      NC,
      laid(b, in.rows,
           {full(b, ds, 0.0), full(b, ck, 0.0), full(b, ck, 0.0), full(b, cv, 0.0),
            full(b, {NC, B, H, C}, 0.0), full(b, ck, 0.0)},
           1),
      [&](HloBuilder& lb, const Value& j, const std::vector<Value>& s) -> std::vector<Value> {
        const Value i = lb.sub(lb.constant({kS32, {}}, double(NC - 1)), j);
        const ChunkGrads g =
            chunk_backward(lb, at_chunk(lb, c, i), factors_at(lb, f, i), at_time(lb, fw[1], i),
                           at_time(lb, fw[2], i), at_time(lb, dOc, i), s[0]);
        return laid(
            lb, in.rows,
            {g.ds, put_time(lb, s[1], g.dq, i), put_time(lb, s[2], g.dk, i), put_time(lb, s[3], g.dv, i),
             put_time(lb, s[4], g.dbeta, i), put_time(lb, s[5], g.dlg, i)},
            1);
      },
      xla::kDeltaRuleLoop);
  // q~ = scale q valid; lg = g keep (keep: inner tokens of documents); padding's gradients are zero
  const Value keep = b.mul(m.valid, b.sub(full(b, {B, T}, 1.0), m.start));
  auto masked = [&](const Value& x, const Value& w, double s) {  // [B, T, W] by a [B, T] mask, to tokens
    const std::vector<int64_t>& d = x.type().dims;
    return from_rows(b, in.rows, b.mul(x, b.mul(bc(b, w, d, {0, 1}), full(b, d, s))));
  };
  return {masked(row_view(b, r[1], T), m.valid, scale), masked(row_view(b, r[2], T), m.valid, 1.0),
          masked(row_view(b, r[3], T), m.valid, 1.0), masked(row_view(b, r[5], T), keep, 1.0),
          masked(row_view(b, r[4], T), m.valid, 1.0)};
}

}  // namespace olmosft::model::unit::delta_emit
