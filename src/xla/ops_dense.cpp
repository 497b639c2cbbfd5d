#include "xla/ops_dense.h"

#include "xla/ops_util.h"

namespace olmosft::xla::ops {

using namespace detail;

namespace {
struct NormDims {
  int64_t M, G, Dg;
  std::vector<int64_t> lead;  // x's dims without the last
};
NormDims norm_dims(const Value& x, const std::optional<Value>& w, int64_t groups, const char* op) {
  expect_type(x, kF32, op, "x");
  const auto& d = x.type().dims;
  OLMO_CHECK(!d.empty() && d.back() > 0, "xla ops: ", op, ": x must have a non-empty last dimension, got ",
             x.type().mlir());
  const int64_t D = d.back();
  OLMO_CHECK(groups >= 1 && D % groups == 0, "xla ops: ", op, ": groups ", groups, " must divide D = ", D);
  if (w) {
    expect_type(*w, kF32, op, "w");
    expect_dims(*w, {D}, op, "w");
  }
  NormDims n{x.type().elements() / D, groups, D / groups, std::vector<int64_t>(d.begin(), d.end() - 1)};
  return n;
}
std::vector<int64_t> rstd_dims(const NormDims& n) {
  std::vector<int64_t> r = n.lead;
  if (n.G > 1) r.push_back(n.G);
  return r;
}
}  // namespace

RmsNormForward rmsnorm_forward(HloBuilder& b, const Value& x, const std::optional<Value>& w, double eps,
                               int64_t groups) {
  const NormDims n = norm_dims(x, w, groups, "rmsnorm_forward");
  const std::vector<int64_t> shp{n.M, n.G, n.Dg};
  const Value xr = b.reshape(x, shp);
  const Value ss = b.reduce_sum(b.mul(xr, xr), {2});  // [M, G]
  const Value ms = b.add(b.div(ss, splat(b, ss, double(n.Dg))), splat(b, ss, eps));
  const Value r = b.div(splat(b, ms, 1.0), b.sqrt(ms));
  Value y = b.mul(xr, bcast(b, r, shp, {0, 1}));
  if (w) y = b.mul(bcast(b, b.reshape(*w, {n.G, n.Dg}), shp, {1, 2}), y);
  return {b.reshape(y, x.type().dims), b.reshape(r, rstd_dims(n))};
}

RmsNormBackward rmsnorm_backward(HloBuilder& b, const Value& dy, const Value& x,
                                 const std::optional<Value>& w, const Value& rstd, int64_t groups) {
  const NormDims n = norm_dims(x, w, groups, "rmsnorm_backward");
  expect_dims(dy, x.type().dims, "rmsnorm_backward", "dy");
  expect_dims(rstd, rstd_dims(n), "rmsnorm_backward", "rstd");
  const std::vector<int64_t> shp{n.M, n.G, n.Dg};
  const Value xr = b.reshape(x, shp), dyr = b.reshape(dy, shp);
  const Value r = b.reshape(rstd, {n.M, n.G});
  const Value g = w ? b.mul(bcast(b, b.reshape(*w, {n.G, n.Dg}), shp, {1, 2}), dyr) : dyr;
  const Value dot = b.reduce_sum(b.mul(xr, g), {2});  // sum_j x_j g_j
  const Value c = b.div(b.mul(b.mul(b.mul(r, r), r), dot), splat(b, dot, double(n.Dg)));
  const Value rb = bcast(b, r, shp, {0, 1});
  const Value dx = b.sub(b.mul(rb, g), b.mul(xr, bcast(b, c, shp, {0, 1})));
  RmsNormBackward out{b.reshape(dx, x.type().dims), std::nullopt};
  if (w) out.dw = b.reshape(b.reduce_sum(b.mul(b.mul(dyr, xr), rb), {0}), {n.G * n.Dg});
  return out;
}

Value swiglu_forward(HloBuilder& b, const Value& a, const Value& up) {
  expect_type(a, kF32, "swiglu_forward", "a");
  expect_dims(up, a.type().dims, "swiglu_forward", "b");
  const Value one = splat(b, a, 1.0);
  return b.mul(b.div(a, b.add(one, b.exp(b.neg(a)))), up);
}

SwigluBackward swiglu_backward(HloBuilder& b, const Value& dh, const Value& a, const Value& up) {
  expect_type(a, kF32, "swiglu_backward", "a");
  expect_dims(up, a.type().dims, "swiglu_backward", "b");
  expect_dims(dh, a.type().dims, "swiglu_backward", "dh");
  const Value one = splat(b, a, 1.0);
  const Value s = b.div(one, b.add(one, b.exp(b.neg(a))));
  const Value db = b.mul(dh, b.mul(a, s));
  const Value da = b.mul(b.mul(dh, up), b.mul(s, b.add(one, b.mul(a, b.sub(one, s)))));
  return {da, db};
}

Value operand(HloBuilder& b, const Value& v, Operands o) {
  return o == Operands::kBF16 ? b.convert(v, ElementType::kBF16) : v;
}

namespace {
void check_linear(const Value& x, const Value& w, const char* op) {
  expect_type(x, kF32, op, "x");
  expect_type(w, kF32, op, "w");
  OLMO_CHECK(x.type().rank() >= 1 && w.type().rank() == 2 && w.type().dims[1] == x.type().dims.back(),
             "xla ops: ", op, ": x [..., in] and w [out, in] do not fit: ", x.type().mlir(), " and ",
             w.type().mlir());
}
}  // namespace

Value linear_forward(HloBuilder& b, const Value& x, const Value& w, Operands o) {
  check_linear(x, w, "linear_forward");
  const int64_t r = x.type().rank();
  return b.dot_general(operand(b, x, o), operand(b, w, o), {{}, {}, {r - 1}, {1}}, kF32);
}

LinearBackward linear_backward(HloBuilder& b, const Value& dy, const Value& x, const Value& w, Operands o) {
  check_linear(x, w, "linear_backward");
  std::vector<int64_t> ydims = x.type().dims;
  ydims.back() = w.type().dims[0];
  expect_dims(dy, ydims, "linear_backward", "dy");
  const int64_t r = x.type().rank();
  const Value dyo = operand(b, dy, o);
  const Value dx = b.dot_general(dyo, operand(b, w, o), {{}, {}, {r - 1}, {0}}, kF32);
  const std::vector<int64_t> lead = range(0, r - 1);
  const Value dw = b.dot_general(dyo, operand(b, x, o), {{}, {}, lead, lead}, kF32);
  return {dx, dw};
}

Value rope_inv_freq_constant(HloBuilder& b, const std::vector<float>& inv_freq) {
  return b.dense_constant({kF32, {int64_t(inv_freq.size())}},
                          std::vector<double>(inv_freq.begin(), inv_freq.end()));
}

RopeTables rope_tables(HloBuilder& b, const Value& positions, const Value& inv_freq, double attention_scaling,
                       bool f64_trig) {
  expect_type(positions, kS32, "rope_tables", "positions");
  expect_type(inv_freq, kF32, "rope_tables", "inv_freq");
  OLMO_CHECK(positions.type().rank() == 1 && inv_freq.type().rank() == 1,
             "xla ops: rope_tables: positions [T] "
             "and inv_freq [D/2] must be vectors, got ",
             positions.type().mlir(), " and ", inv_freq.type().mlir());
  const int64_t T = positions.type().dims[0], half = inv_freq.type().dims[0];
  const std::vector<int64_t> shp{T, half};
  const Value ang = b.mul(bcast(b, b.convert(positions, kF32), shp, {0}), bcast(b, inv_freq, shp, {1}));
  auto trig = [&](bool cosine) {
    if (!f64_trig) return cosine ? b.cos(ang) : b.sin(ang);
    const Value a64 = b.convert(ang, ElementType::kF64);
    return b.convert(cosine ? b.cos(a64) : b.sin(a64), kF32);
  };
  const Value scale = full(b, shp, double(float(attention_scaling)));
  return {b.mul(trig(true), scale), b.mul(trig(false), scale)};
}

namespace {
Value rope_apply(HloBuilder& b, const Value& x, const RopeTables& t, bool backward) {
  const char* op = backward ? "rope_backward" : "rope_forward";
  expect_type(x, kF32, op, "x");
  const auto& td = t.cos.type().dims;
  OLMO_CHECK(
      x.type().rank() == 3 && td.size() == 2 && x.type().dims[0] == td[0] && x.type().dims[2] == 2 * td[1],
      "xla ops: ", op, ": x must be [T, H, 2 * half] for tables ", t.cos.type().mlir(), ", got ",
      x.type().mlir());
  const int64_t T = td[0], half = td[1], H = x.type().dims[1];
  const std::vector<int64_t> shp{T, H, half};
  const Value x1 = b.slice(x, {0, 0, 0}, shp), x2 = b.slice(x, {0, 0, half}, {T, H, 2 * half});
  const Value c = bcast(b, t.cos, shp, {0, 2}), s = bcast(b, t.sin, shp, {0, 2});
  if (!backward)  // [a, b] -> [a c - b s, b c + a s]
    return b.concatenate({b.sub(b.mul(x1, c), b.mul(x2, s)), b.add(b.mul(x2, c), b.mul(x1, s))}, 2);
  // transpose: [a, b] -> [a c + b s, b c - a s]
  return b.concatenate({b.add(b.mul(x1, c), b.mul(x2, s)), b.sub(b.mul(x2, c), b.mul(x1, s))}, 2);
}
}  // namespace

Value rope_forward(HloBuilder& b, const Value& x, const RopeTables& tables) {
  return rope_apply(b, x, tables, false);
}
Value rope_backward(HloBuilder& b, const Value& dy, const RopeTables& tables) {
  return rope_apply(b, dy, tables, true);
}

}  // namespace olmosft::xla::ops
