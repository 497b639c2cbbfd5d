// The StableHLO emitter: every op compiled by XLA's CPU plugin and run against a C++ reference, the builder's
// shape checks, the custom_call text, and an end-to-end softmax cross-entropy with its gradient against
// float64.
//
// Tolerances: ops that only move, compare, select or convert data, and the IEEE-exact arithmetic of add, sub,
// mul, neg, abs, max and min, are compared bit for bit with the same float operation in C++. div and sqrt are
// correctly rounded in IEEE, but XLA may rewrite them (x / c as x * (1/c)): 1 float ulp (1.2e-7 relative)
// against float64 on the same float inputs. exp, log, tanh, logistic, rsqrt and pow are XLA's own vectorised
// approximations, not libm: 1e-6 relative (about 8 float ulps; measured at most 1.5e-7, tanh, on XLA 0.0.1's
// CPU plugin; each case prints its measured error). Sums (reduce, dot_general, the cross-entropy) accumulate
// in float in an order XLA chooses: 1e-6 relative to the sum of absolute terms.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <optional>
#include <random>

#include "core/bf16.h"
#include "core/error.h"
#include "xla/hlo_builder.h"
#include "xla/pjrt.h"
#include "xla_test_util.h"

using namespace olmosft;
using namespace olmosft::xla;

namespace {

constexpr ElementType F32 = ElementType::kF32;
constexpr ElementType S32 = ElementType::kS32;

Client& cpu() { return testutil::test_client(1); }

std::vector<float> randu(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

using testutil::error_of;

// Compiles B's module, runs it on ARGS (host arrays with their types) and returns the outputs.
std::vector<Buffer> run(const HloBuilder& b, const std::vector<std::pair<const void*, TensorType>>& args) {
  Client& c = cpu();
  Executable exe = c.compile(b.module());
  std::vector<Buffer> in;
  for (const auto& [data, type] : args) in.push_back(c.to_device(data, type));
  std::vector<Buffer*> ptrs;
  for (Buffer& x : in) ptrs.push_back(&x);
  return exe.execute(ptrs);
}

// One-input float function: builds OP(x) over X (shape {n}) and returns the result.
std::vector<float> run_unary(const std::vector<float>& x,
                             const std::function<Value(HloBuilder&, Value)>& op) {
  HloBuilder b;
  Value a = b.argument({F32, {int64_t(x.size())}});
  b.returns({op(b, a)});
  return run(b, {{x.data(), {F32, {int64_t(x.size())}}}})[0].to_host<float>();
}

std::vector<float> run_binary(const std::vector<float>& x, const std::vector<float>& y,
                              const std::function<Value(HloBuilder&, Value, Value)>& op) {
  HloBuilder b;
  const TensorType t{F32, {int64_t(x.size())}};
  Value a = b.argument(t), c = b.argument(t);
  b.returns({op(b, a, c)});
  return run(b, {{x.data(), t}, {y.data(), t}})[0].to_host<float>();
}

void expect_rel(const std::vector<float>& got, const std::vector<double>& want, double rel,
                const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max(1.0, std::fabs(want[i]));
    EXPECT_NEAR(got[i], want[i], rel * scale) << what << " at " << i;
    worst = std::max(worst, std::fabs(got[i] - want[i]) / scale);
  }
  std::cout << what << ": max relative error " << worst << " (allowed " << rel << ")\n";
}

}  // namespace

TEST(XlaHloBuilder, ExactElementwiseOps) {
  const auto x = randu(64, -3, 3, 1), y = randu(64, -3, 3, 2);
  struct Case {
    const char* name;
    std::function<Value(HloBuilder&, Value, Value)> op;
    std::function<float(float, float)> ref;
  };
  const std::vector<Case> cases = {
      {"add", [](HloBuilder& b, Value a, Value c) { return b.add(a, c); },
       [](float a, float c) { return a + c; }},
      {"sub", [](HloBuilder& b, Value a, Value c) { return b.sub(a, c); },
       [](float a, float c) { return a - c; }},
      {"mul", [](HloBuilder& b, Value a, Value c) { return b.mul(a, c); },
       [](float a, float c) { return a * c; }},
      {"max", [](HloBuilder& b, Value a, Value c) { return b.max(a, c); },
       [](float a, float c) { return std::max(a, c); }},
      {"min", [](HloBuilder& b, Value a, Value c) { return b.min(a, c); },
       [](float a, float c) { return std::min(a, c); }},
      {"neg", [](HloBuilder& b, Value a, Value) { return b.neg(a); }, [](float a, float) { return -a; }},
      {"abs", [](HloBuilder& b, Value a, Value) { return b.abs(a); },
       [](float a, float) { return std::fabs(a); }},
  };
  for (const Case& c : cases) {
    const auto got = run_binary(x, y, c.op);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(got[i], c.ref(x[i], y[i])) << c.name << " at " << i;
  }
}

TEST(XlaHloBuilder, RoundedAndTranscendentalOps) {
  const auto x = randu(256, -4, 4, 3), pos = randu(256, 0.05f, 6, 4), y = randu(256, 0.5f, 3, 5);
  auto ref = [](const std::vector<float>& v, double (*f)(double)) {
    std::vector<double> out;
    for (float a : v) out.push_back(f(a));
    return out;
  };
  std::vector<double> div, pw;
  for (size_t i = 0; i < x.size(); ++i) {
    div.push_back(double(x[i]) / double(y[i]));
    pw.push_back(std::pow(double(pos[i]), double(x[i]) / 2));
  }
  expect_rel(run_binary(x, y, [](HloBuilder& b, Value a, Value c) { return b.div(a, c); }), div, 1.2e-7,
             "div");
  expect_rel(run_unary(pos, [](HloBuilder& b, Value a) { return b.sqrt(a); }), ref(pos, std::sqrt), 1.2e-7,
             "sqrt");
  const double approx = 1e-6;
  expect_rel(run_unary(x, [](HloBuilder& b, Value a) { return b.exp(a); }), ref(x, std::exp), approx, "exp");
  expect_rel(run_unary(pos, [](HloBuilder& b, Value a) { return b.log(a); }), ref(pos, std::log), approx,
             "log");
  expect_rel(run_unary(x, [](HloBuilder& b, Value a) { return b.tanh(a); }), ref(x, std::tanh), approx,
             "tanh");
  expect_rel(run_unary(pos, [](HloBuilder& b, Value a) { return b.rsqrt(a); }),
             ref(pos, [](double v) { return 1 / std::sqrt(v); }), approx, "rsqrt");
  expect_rel(run_unary(x, [](HloBuilder& b, Value a) { return b.logistic(a); }),
             ref(x, [](double v) { return 1 / (1 + std::exp(-v)); }), approx, "logistic");
  const auto angle = randu(256, -200, 200, 11);  // cos/sin: absolute 1e-6 (the values are at most 1)
  expect_rel(run_unary(angle, [](HloBuilder& b, Value a) { return b.cos(a); }), ref(angle, std::cos), approx,
             "cos");
  expect_rel(run_unary(angle, [](HloBuilder& b, Value a) { return b.sin(a); }), ref(angle, std::sin), approx,
             "sin");
  std::vector<float> half(x.size());
  for (size_t i = 0; i < x.size(); ++i) half[i] = x[i] / 2;
  expect_rel(run_binary(pos, half, [](HloBuilder& b, Value a, Value c) { return b.pow(a, c); }), pw, approx,
             "pow");
}

TEST(XlaHloBuilder, CompareSelectIotaConstant) {
  const auto x = randu(6, -1, 1, 6), y = randu(6, -1, 1, 7);
  HloBuilder b;
  const TensorType t{F32, {2, 3}};
  Value a = b.argument(t), c = b.argument(t);
  Value gt = b.compare(a, c, Compare::kGt);
  Value picked = b.select(gt, a, b.constant(t, -0.25));
  Value io = b.iota({S32, {2, 3}}, 1);
  Value eq = b.compare(io, b.constant({S32, {2, 3}}, 1), Compare::kEq);
  Value scalar_pred = b.compare(b.scalar(S32, 2), b.scalar(S32, 3), Compare::kLe);
  Value whole = b.select(scalar_pred, c, a);
  b.returns({picked, io, b.convert(eq, S32), whole, b.scalar(ElementType::kF64, 1.0 / 3)});
  auto out = run(b, {{x.data(), t}, {y.data(), t}});
  const auto p = out[0].to_host<float>();
  const auto i = out[1].to_host<int32_t>();
  const auto e = out[2].to_host<int32_t>();
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(p[k], x[k] > y[k] ? x[k] : -0.25f);
    EXPECT_EQ(i[k], k % 3);
    EXPECT_EQ(e[k], k % 3 == 1 ? 1 : 0);
  }
  EXPECT_EQ(out[3].to_host<float>(), y);
  EXPECT_EQ(out[4].to_host<double>(), std::vector<double>{1.0 / 3});  // hex literal: exact bits
}

TEST(XlaHloBuilder, BroadcastReduceAndDotGeneral) {
  const int64_t B = 2, M = 3, K = 5, N = 4;
  const auto x = randu(B * M * K, -1, 1, 8), w = randu(B * K * N, -1, 1, 9), v = randu(M, -2, 2, 10);
  HloBuilder hb;
  Value X = hb.argument({F32, {B, M, K}}), W = hb.argument({F32, {B, K, N}}), V = hb.argument({F32, {M}});
  Value Y = hb.dot_general(X, W, {{0}, {0}, {2}, {1}});   // [B, M, N]
  Value Yt = hb.dot_general(W, X, {{0}, {0}, {1}, {2}});  // [B, N, M]
  Value Vb = hb.broadcast_in_dim(V, {B, M, N}, {1});      // v[m] everywhere
  hb.returns({Y, Yt, hb.add(Y, Vb), hb.reduce_sum(X, {0, 2}), hb.reduce_max(X, {2})});
  // f32 products at full precision on every device (a GPU's DEFAULT allows TF32, a TPU's one bf16 pass)
  const std::string text = hb.module();
  const std::string full =
      "precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
  size_t highest = 0;
  for (size_t at = text.find(full); at != std::string::npos; at = text.find(full, at + full.size()))
    ++highest;
  EXPECT_EQ(highest, 2u) << text;
  auto out = run(hb, {{x.data(), {F32, {B, M, K}}}, {w.data(), {F32, {B, K, N}}}, {v.data(), {F32, {M}}}});
  EXPECT_EQ(out[0].type(), (TensorType{F32, {B, M, N}}));
  EXPECT_EQ(out[1].type(), (TensorType{F32, {B, N, M}}));
  const auto y = out[0].to_host<float>(), yt = out[1].to_host<float>(), yb = out[2].to_host<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0, sa = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = double(x[(b * M + m) * K + k]) * w[(b * K + k) * N + n];
          s += p;
          sa += std::fabs(p);
        }
        EXPECT_NEAR(y[(b * M + m) * N + n], s, 1e-6 * sa);
        EXPECT_NEAR(yt[(b * N + n) * M + m], s, 1e-6 * sa);
        EXPECT_EQ(yb[(b * M + m) * N + n], y[(b * M + m) * N + n] + v[m]);
      }
  const auto rs = out[3].to_host<float>(), rm = out[4].to_host<float>();
  for (int64_t m = 0; m < M; ++m) {
    double s = 0, sa = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < K; ++k) {
        s += x[(b * M + m) * K + k];
        sa += std::fabs(x[(b * M + m) * K + k]);
      }
    EXPECT_NEAR(rs[m], s, 1e-6 * sa);
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m)
      EXPECT_EQ(rm[b * M + m],
                *std::max_element(x.begin() + (b * M + m) * K, x.begin() + (b * M + m + 1) * K));
}

// bf16 operands with an f32 result: every product of two bf16 values is exact in f32, so the result is the
// f32 sum of exact products (1e-6 of the sum of absolute terms against float64 on the rounded operands).
TEST(XlaHloBuilder, DotGeneralBf16OperandsF32Result) {
  const int64_t M = 4, K = 96, N = 3;
  const auto x = randu(M * K, -1, 1, 12), w = randu(N * K, -1, 1, 13);
  HloBuilder hb;
  Value X = hb.argument({F32, {M, K}}), W = hb.argument({F32, {N, K}});
  Value Y = hb.dot_general(hb.convert(X, ElementType::kBF16), hb.convert(W, ElementType::kBF16),
                           {{}, {}, {1}, {1}}, F32);
  EXPECT_EQ(Y.type(), (TensorType{F32, {M, N}}));
  hb.returns({Y});
  EXPECT_EQ(hb.module().find("precision"), std::string::npos);  // bf16 operands: the device's default
  const auto y = run(hb, {{x.data(), {F32, {M, K}}}, {w.data(), {F32, {N, K}}}})[0].to_host<float>();
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p =
            double(bf16_to_f32(f32_to_bf16(x[m * K + k]))) * double(bf16_to_f32(f32_to_bf16(w[n * K + k])));
        s += p;
        sa += std::fabs(p);
      }
      EXPECT_NEAR(y[m * N + n], s, 1e-6 * sa);
      worst = std::max(worst, std::fabs(y[m * N + n] - s) / sa);
    }
  std::cout << "bf16 x bf16 -> f32 dot: max error " << worst << " of the sum of |terms| (allowed 1e-6)\n";
  HloBuilder bad;
  Value a = bad.argument({F32, {2, 2}});
  const std::string msg = error_of([&] { bad.dot_general(a, a, {{}, {}, {1}, {0}}, ElementType::kBF16); });
  EXPECT_NE(msg.find("result element type bf16 must be a float type at least as wide as the operands' f32"),
            std::string::npos)
      << msg;
}

// Dense constants: f32 bits round-trip exactly (signed zero, a denormal, NaN, infinity, 1/3), a rank-2 one is
// row-major, s32 and f64 (1/3 exact in f64) too; a wrong count is refused.
TEST(XlaHloBuilder, DenseConstant) {
  const float third = 1.0f / 3;
  const std::vector<double> f = {-0.0, 1e-40f, std::nan(""), -INFINITY, third, 2.5};
  HloBuilder b;
  b.returns({b.dense_constant({F32, {2, 3}}, f), b.dense_constant({S32, {3}}, {-7, 0, 2147483647}),
             b.dense_constant({ElementType::kF64, {2}}, {1.0 / 3, -2}), b.dense_constant({F32, {1}}, {4})});
  auto out = run(b, {});
  EXPECT_EQ(out[0].type(), (TensorType{F32, {2, 3}}));
  const auto got = out[0].to_host<float>();
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f32_bits(got[i]), f32_bits(float(f[i]))) << i;
  EXPECT_EQ(out[1].to_host<int32_t>(), (std::vector<int32_t>{-7, 0, 2147483647}));
  EXPECT_EQ(out[2].to_host<double>(), (std::vector<double>{1.0 / 3, -2}));
  EXPECT_EQ(out[3].to_host<float>(), (std::vector<float>{4}));
  HloBuilder bad;
  const std::string msg = error_of([&] { bad.dense_constant({F32, {2, 2}}, {1, 2, 3}); });
  EXPECT_NE(msg.find("dense_constant: 3 values for tensor<2x2xf32> (4 elements)"), std::string::npos) << msg;
}

TEST(XlaHloBuilder, ShapeOps) {
  std::vector<float> x(24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  HloBuilder b;
  Value X = b.argument({F32, {2, 3, 4}});
  Value r = b.reshape(X, {6, 4});
  Value t = b.transpose(X, {2, 0, 1});                          // [4, 2, 3]
  Value s = b.slice(r, {1, 0}, {6, 4}, {2, 3});                 // rows 1,3,5; cols 0,3
  Value c = b.concatenate({r, b.slice(r, {0, 0}, {2, 4})}, 0);  // [8, 4]
  Value i1 = b.scalar(S32, 1), i2 = b.scalar(S32, 2), big = b.scalar(S32, 100);
  Value ds = b.dynamic_slice(r, {i2, i1}, {3, 2});        // rows 2..4, cols 1..2
  Value clamped = b.dynamic_slice(r, {big, i1}, {2, 2});  // start clamped to row 4
  Value dus = b.dynamic_update_slice(r, b.constant({F32, {2, 2}}, -1), {i1, i2});
  b.returns({t, s, c, ds, clamped, dus});
  auto out = run(b, {{x.data(), {F32, {2, 3, 4}}}});
  const auto T = out[0].to_host<float>();
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(T[(k * 2 + i) * 3 + j], x[(i * 3 + j) * 4 + k]);
  EXPECT_EQ(out[1].to_host<float>(), (std::vector<float>{4, 7, 12, 15, 20, 23}));
  const auto C = out[2].to_host<float>();
  EXPECT_EQ(std::vector<float>(C.begin(), C.begin() + 24), x);
  EXPECT_EQ(std::vector<float>(C.begin() + 24, C.end()), std::vector<float>(x.begin(), x.begin() + 8));
  EXPECT_EQ(out[3].to_host<float>(), (std::vector<float>{9, 10, 13, 14, 17, 18}));
  EXPECT_EQ(out[4].to_host<float>(), (std::vector<float>{17, 18, 21, 22}));
  auto U = out[5].to_host<float>();
  std::vector<float> want = x;
  for (int i : {1, 2})
    for (int j : {2, 3}) want[i * 4 + j] = -1;
  EXPECT_EQ(U, want);
}

// gather_rows only moves data: bit for bit against C++ indexing, for ids with repeats and the first and last
// rows, an s32 table with [B, T] ids, and a rank-1 table. An out-of-range id is clamped by XLA (documented in
// hlo_builder.h: the caller validates ids on the host).
TEST(XlaHloBuilder, GatherRows) {
  const int64_t V = 7, D = 5;
  const auto table = randu(V * D, -2, 2, 14);
  const std::vector<int32_t> ids = {3, 0, 6, 3, 3, 6, 1, 0}, wild = {-3, 100};
  std::vector<int32_t> itable(4 * 3), ivec = {10, 20, 30, 40};
  for (size_t k = 0; k < itable.size(); ++k) itable[k] = int32_t(k * k) - 7;
  const std::vector<int32_t> bt = {2, 0, 3, 3, 1, 2};  // [2, 3]
  HloBuilder b;
  Value T = b.argument({F32, {V, D}}), I = b.argument({S32, {8}}), W = b.argument({S32, {2}});
  Value IT = b.argument({S32, {4, 3}}), BT = b.argument({S32, {2, 3}}), IV = b.argument({S32, {4}});
  Value g = b.gather_rows(T, I), gbt = b.gather_rows(IT, BT);
  EXPECT_EQ(g.type(), (TensorType{F32, {8, D}}));
  EXPECT_EQ(gbt.type(), (TensorType{S32, {2, 3, 3}}));
  b.returns({g, gbt, b.gather_rows(IV, BT), b.gather_rows(T, W)});
  auto out = run(b, {{table.data(), {F32, {V, D}}},
                     {ids.data(), {S32, {8}}},
                     {wild.data(), {S32, {2}}},
                     {itable.data(), {S32, {4, 3}}},
                     {bt.data(), {S32, {2, 3}}},
                     {ivec.data(), {S32, {4}}}});
  const auto got = out[0].to_host<float>();
  for (size_t n = 0; n < ids.size(); ++n)
    for (int64_t d = 0; d < D; ++d)
      EXPECT_EQ(f32_bits(got[n * D + size_t(d)]), f32_bits(table[size_t(ids[n] * D + d)])) << n << "," << d;
  const auto gi = out[1].to_host<int32_t>(), gv = out[2].to_host<int32_t>();
  for (size_t n = 0; n < bt.size(); ++n) {
    for (size_t d = 0; d < 3; ++d) EXPECT_EQ(gi[n * 3 + d], itable[size_t(bt[n]) * 3 + d]) << n;
    EXPECT_EQ(gv[n], ivec[size_t(bt[n])]) << n;
  }
  const auto clamped = out[3].to_host<float>();
  EXPECT_EQ(std::vector<float>(clamped.begin(), clamped.begin() + D),
            std::vector<float>(table.begin(), table.begin() + D));  // -3 -> row 0
  EXPECT_EQ(std::vector<float>(clamped.begin() + D, clamped.end()),
            std::vector<float>(table.end() - D, table.end()));  // 100 -> row V-1
}

// scatter_add_rows with duplicate ids against a float64 sum: XLA may add the duplicates into a row in any
// order, so the float result may differ from any one sequential sum by rounding: 1e-6 of the sum of |terms|.
// With unique ids each element is one float addition, exact against the same addition in C++; an s32 table
// ([B, T] ids) is exact whatever the order. An update with an out-of-range id is dropped by XLA.
TEST(XlaHloBuilder, ScatterAddRows) {
  const int64_t V = 6, D = 4, N = 10;
  const auto table = randu(V * D, -2, 2, 15), upd = randu(N * D, -1, 1, 16);
  const std::vector<int32_t> ids = {5, 0, 2, 5, 5, 0, 3, 2, 5, 0}, uniq = {4, 0, 5};
  const std::vector<int32_t> wild = {-1, 6, 2};
  const std::vector<int32_t> itable = {1, 2, 3, 4, 5, 6}, bt = {2, 0, 2, 2, 1, 0},
                             iupd = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120};
  HloBuilder b;
  const TensorType tt{F32, {V, D}};
  Value T = b.argument(tt), I = b.argument({S32, {N}}), U = b.argument({F32, {N, D}});
  Value Q = b.argument({S32, {3}}), W = b.argument({S32, {3}});
  Value IT = b.argument({S32, {3, 2}}), BT = b.argument({S32, {2, 3}}), IU = b.argument({S32, {2, 3, 2}});
  Value U3 = b.slice(U, {0, 0}, {3, D});
  Value s = b.scatter_add_rows(T, I, U);
  EXPECT_EQ(s.type(), tt);
  b.returns({s, b.scatter_add_rows(T, Q, U3), b.scatter_add_rows(IT, BT, IU), b.scatter_add_rows(T, W, U3)});
  auto out = run(b, {{table.data(), tt},
                     {ids.data(), {S32, {N}}},
                     {upd.data(), {F32, {N, D}}},
                     {uniq.data(), {S32, {3}}},
                     {wild.data(), {S32, {3}}},
                     {itable.data(), {S32, {3, 2}}},
                     {bt.data(), {S32, {2, 3}}},
                     {iupd.data(), {S32, {2, 3, 2}}}});
  const auto got = out[0].to_host<float>();
  double worst = 0;
  for (int64_t v = 0; v < V; ++v)
    for (int64_t d = 0; d < D; ++d) {
      double want = table[size_t(v * D + d)], sa = std::fabs(want);
      for (int64_t n = 0; n < N; ++n)
        if (ids[size_t(n)] == v) {
          want += upd[size_t(n * D + d)];
          sa += std::fabs(upd[size_t(n * D + d)]);
        }
      EXPECT_NEAR(got[size_t(v * D + d)], want, 1e-6 * sa) << v << "," << d;
      worst = std::max(worst, std::fabs(got[size_t(v * D + d)] - want) / sa);
    }
  std::cout << "scatter_add_rows with duplicates: max error " << worst
            << " of the sum of |terms| (allowed 1e-6)\n";
  std::vector<float> want_uniq = table, want_wild = table;
  for (size_t n = 0; n < uniq.size(); ++n)
    for (int64_t d = 0; d < D; ++d) want_uniq[size_t(uniq[n] * D + d)] += upd[n * D + size_t(d)];
  for (int64_t d = 0; d < D; ++d) want_wild[size_t(2 * D + d)] += upd[2 * D + size_t(d)];
  EXPECT_EQ(out[1].to_host<float>(), want_uniq);
  std::vector<int32_t> want_int = itable;
  for (size_t n = 0; n < bt.size(); ++n)
    for (size_t d = 0; d < 2; ++d) want_int[size_t(bt[n]) * 2 + d] += iupd[n * 2 + d];
  EXPECT_EQ(out[2].to_host<int32_t>(), want_int);
  EXPECT_EQ(out[3].to_host<float>(), want_wild);  // ids -1 and 6 (= V) dropped
}

TEST(XlaHloBuilder, GatherScatterRefuseMismatches) {
  HloBuilder b;
  Value t = b.argument({F32, {7, 4}}), ids = b.argument({S32, {3}}), u = b.argument({F32, {3, 4}});
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  has(error_of([&] {
        b.gather_rows(t, b.argument({ElementType::kS64, {3}}));
      }),
      "gather_rows: ids tensor<3xi64> must be s32 of rank 1 ([N]) or 2 ([B, T]) (table tensor<7x4xf32>)");
  has(error_of([&] {
        b.gather_rows(t, b.argument({F32, {3}}));
      }),
      "gather_rows: ids tensor<3xf32> must be s32");
  has(error_of([&] { b.gather_rows(t, b.argument({S32, {1, 2, 3}})); }), "ids tensor<1x2x3xi32> must be s32");
  has(error_of([&] { b.gather_rows(b.scalar(F32, 1), ids); }),
      "gather_rows: the table tensor<f32> needs rank >= 1 and at least one row");
  has(error_of([&] {
        b.scatter_add_rows(t, b.argument({S32, {3, 1}}), u);
      }),
      "scatter_add_rows: updates tensor<3x4xf32> must be tensor<3x1x4xf32>");
  has(error_of([&] {
        b.scatter_add_rows(t, ids, b.argument({F32, {3, 5}}));
      }),
      "scatter_add_rows: updates tensor<3x5xf32> must be tensor<3x4xf32> (ids tensor<3xi32> into table "
      "tensor<7x4xf32>)");
  has(error_of([&] {
        b.scatter_add_rows(t, ids, b.argument({ElementType::kF64, {3, 4}}));
      }),
      "scatter_add_rows: updates tensor<3x4xf64> must be tensor<3x4xf32>");
  has(error_of([&] {
        b.scatter_add_rows(t, b.argument({ElementType::kS64, {3}}), u);
      }),
      "scatter_add_rows: ids tensor<3xi64> must be s32");
  const TensorType pred{ElementType::kPred, {7, 4}};
  has(error_of([&] {
        b.scatter_add_rows(b.argument(pred), ids, b.argument({ElementType::kPred, {3, 4}}));
      }),
      "scatter_add_rows of a pred table tensor<7x4xi1>");
}

// triangular_solve (the chunked delta rule's WY solve and its adjoint): a batch of two unit lower triangular
// systems of 6 rows and 3 right-hand sides, op(A) = A and A^T, against float64 substitution in C++. The
// upper triangle and the diagonal hold garbage the op must not read (lower, unit_diagonal); one upper
// triangular solve reads the other half. Rounding: XLA's blocked solve sums in its own order, so 1e-6 of the
// scale (the solutions are O(1); measured printed).
TEST(XlaHloBuilder, TriangularSolve) {
  const int64_t nb = 2, n = 6, m = 3;
  std::vector<float> a = randu(size_t(nb * n * n), -0.5f, 0.5f, 31),
                     rhs = randu(size_t(nb * n * m), -1, 1, 32);
  for (int64_t k = 0; k < nb; ++k)
    for (int64_t i = 0; i < n; ++i) a[size_t(k * n * n + i * n + i)] = 1e30f;  // never read (unit)
  HloBuilder b;
  const Value A = b.argument({F32, {nb, n, n}}), R = b.argument({F32, {nb, n, m}});
  b.returns({b.triangular_solve(A, R, true, true, false), b.triangular_solve(A, R, true, true, true),
             b.triangular_solve(A, R, false, true, false)});
  auto out = run(b, {{a.data(), {F32, {nb, n, n}}}, {rhs.data(), {F32, {nb, n, m}}}});
  // op(A)[i][j] of the unit triangle that LOWER names (TRANSPOSE: A^T)
  auto el = [&](int64_t k, int64_t i, int64_t j, bool lower, bool tr) -> double {
    if (i == j) return 1.0;
    const int64_t r = tr ? j : i, c = tr ? i : j;
    if (lower ? c > r : c < r) return 0.0;
    return a[size_t(k * n * n + r * n + c)];
  };
  auto solve = [&](bool lower, bool tr) {  // op(A) is lower triangular iff LOWER != TR
    std::vector<double> x(size_t(nb * n * m));
    const bool fwd = lower != tr;
    for (int64_t k = 0; k < nb; ++k)
      for (int64_t jj = 0; jj < m; ++jj)
        for (int64_t s = 0; s < n; ++s) {
          const int64_t i = fwd ? s : n - 1 - s;
          double v = rhs[size_t(k * n * m + i * m + jj)];
          for (int64_t j = 0; j < n; ++j)
            if (j != i && (fwd ? j < i : j > i))
              v -= el(k, i, j, lower, tr) * x[size_t(k * n * m + j * m + jj)];
          x[size_t(k * n * m + i * m + jj)] = v;
        }
    return x;
  };
  expect_rel(out[0].to_host<float>(), solve(true, false), 1e-6, "triangular_solve lower");
  expect_rel(out[1].to_host<float>(), solve(true, true), 1e-6, "triangular_solve lower, transposed");
  expect_rel(out[2].to_host<float>(), solve(false, false), 1e-6, "triangular_solve upper");
  HloBuilder b2;
  const Value A2 = b2.argument({F32, {nb, n, n}}), R2 = b2.argument({F32, {nb, m, n}});
  EXPECT_NE(error_of([&] {
              b2.triangular_solve(A2, R2, true, true, false);
            }).find("triangular_solve: a tensor<2x6x6xf32> must be [..., n, n]"),
            std::string::npos);
}

// cumsum (the sparse MoE's queue positions): an s32 [5, 3] along each dimension, exact against C++; an f32
// one against a float64 running sum (XLA's tree order: 1e-6 relative to the sum of |terms|).
TEST(XlaHloBuilder, Cumsum) {
  const int64_t R = 5, C = 3;
  std::vector<int32_t> xi(size_t(R * C));
  for (size_t i = 0; i < xi.size(); ++i) xi[i] = int32_t(i * 7 % 11) - 4;
  const std::vector<float> xf = randu(257, -1, 1, 33);
  HloBuilder b;
  const Value I = b.argument({S32, {R, C}}), X = b.argument({F32, {257}});
  b.returns({b.cumsum(I, 0), b.cumsum(I, 1), b.cumsum(X, 0)});
  auto out = run(b, {{xi.data(), {S32, {R, C}}}, {xf.data(), {F32, {257}}}});
  const auto r0 = out[0].to_host<int32_t>(), r1 = out[1].to_host<int32_t>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      int32_t down = 0, across = 0;
      for (int64_t i = 0; i <= r; ++i) down += xi[size_t(i * C + c)];
      for (int64_t j = 0; j <= c; ++j) across += xi[size_t(r * C + j)];
      EXPECT_EQ(r0[size_t(r * C + c)], down) << r << "," << c;
      EXPECT_EQ(r1[size_t(r * C + c)], across) << r << "," << c;
    }
  std::vector<double> want;
  double acc = 0;
  for (float v : xf) want.push_back(acc += v);
  expect_rel(out[2].to_host<float>(), want, 1e-6 * 257, "cumsum f32");
  HloBuilder b2;
  EXPECT_NE(error_of([&] {
              b2.cumsum(b2.argument({F32, {3}}), 1);
            }).find("cumsum of tensor<3xf32> along dimension 1"),
            std::string::npos);
}

TEST(XlaHloBuilder, ConvertBf16AndF32) {
  auto x = randu(100, -300, 300, 11);
  x.push_back(1.00390625f);  // halfway between two bf16 values: ties to even
  x.push_back(1.01171875f);
  HloBuilder b;
  const TensorType t{F32, {int64_t(x.size())}};
  Value X = b.argument(t);
  Value h = b.convert(X, ElementType::kBF16);
  b.returns({h, b.convert(h, F32)});
  auto out = run(b, {{x.data(), t}});
  const auto bits = out[0].to_host<uint16_t>();
  const auto back = out[1].to_host<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(bits[i], f32_to_bf16(x[i])) << x[i];
    EXPECT_EQ(back[i], bf16_to_f32(f32_to_bf16(x[i])));
  }
}

TEST(XlaHloBuilder, WhileLoopScan) {
  // Cumulative sum over the rows of X [5, 3] with a counted loop (dynamic_slice / dynamic_update_slice), and
  // a plain while loop that doubles a value until it passes 100.
  const auto x = randu(15, -1, 1, 12);
  HloBuilder b;
  const TensorType t{F32, {5, 3}};
  Value X = b.argument(t);
  Value zero = b.scalar(S32, 0);
  auto scan = b.for_loop(5, {b.constant(t, 0), b.constant({F32, {1, 3}}, 0)},
                         [&](HloBuilder& h, const Value& i, const std::vector<Value>& s) {
                           Value row = h.dynamic_slice(X, {i, zero}, {1, 3});  // captured from the function
                           Value acc = h.add(s[1], row);
                           return std::vector<Value>{h.dynamic_update_slice(s[0], acc, {i, zero}), acc};
                         });
  auto doubled = b.while_loop(
      {b.scalar(F32, 1.5)},
      [](HloBuilder& h, const std::vector<Value>& v) {
        return std::vector<Value>{h.compare(v[0], h.scalar(F32, 100), Compare::kLt)};
      },
      [](HloBuilder& h, const std::vector<Value>& v) { return std::vector<Value>{h.add(v[0], v[0])}; });
  b.returns({scan[0], doubled[0]});
  auto out = run(b, {{x.data(), t}});
  const auto cs = out[0].to_host<float>();
  std::vector<float> acc(3, 0.f);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) {
      acc[j] += x[i * 3 + j];  // same float additions in the same order
      EXPECT_EQ(cs[i * 3 + j], acc[j]);
    }
  EXPECT_EQ(out[1].to_host<float>(), std::vector<float>{192.f});
}

TEST(XlaHloBuilder, MultipleArgumentsResultsAndAliasing) {
  HloBuilder b("multi");
  Value a = b.argument({F32, {3}}, 1), c = b.argument({S32, {2}});
  b.returns({c, b.add(a, a)});
  const std::string text = b.module();
  EXPECT_NE(text.find("module @multi"), std::string::npos);
  EXPECT_NE(text.find("%arg0: tensor<3xf32> {tf.aliasing_output = 1 : i32}"), std::string::npos) << text;
  EXPECT_NE(text.find("-> (tensor<2xi32>, tensor<3xf32>)"), std::string::npos) << text;
  Client& cl = cpu();
  Executable exe = cl.compile(text);
  std::vector<float> av{1, 2, 3};
  std::vector<int32_t> cv{7, 8};
  Buffer A = cl.to_device(std::span<const float>(av), {3}),
         C = cl.to_device(std::span<const int32_t>(cv), {2});
  Buffer* args[] = {&A, &C};
  const size_t donate[] = {0};
  auto out = exe.execute(args, donate);
  EXPECT_EQ(out[0].to_host<int32_t>(), cv);
  EXPECT_EQ(out[1].to_host<float>(), (std::vector<float>{2, 4, 6}));
  EXPECT_TRUE(A.consumed());
}

TEST(XlaHloBuilder, CustomCallText) {
  HloBuilder b;
  Value q = b.argument({ElementType::kBF16, {1, 8, 2, 4}});
  CustomCallOptions o;
  o.backend_config = "{\"mask\": \"CAUSAL\"}\n";
  auto r = b.custom_call("__cudnn$fmhaSoftmax", {q, q, q},
                         {{ElementType::kBF16, {1, 8, 2, 4}}, {F32, {1, 2, 8}}}, o);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].type(), (TensorType{F32, {1, 2, 8}}));
  b.returns({r[0]});
  const std::string text = b.module();
  EXPECT_NE(
      text.find("%v0:2 = \"stablehlo.custom_call\"(%arg0, %arg0, %arg0) {call_target_name = "
                "\"__cudnn$fmhaSoftmax\", has_side_effect = false, backend_config = "
                "\"{\\22mask\\22: \\22CAUSAL\\22}\\0A\", api_version = 2 : i32} : (tensor<1x8x2x4xbf16>, "
                "tensor<1x8x2x4xbf16>, tensor<1x8x2x4xbf16>) -> (tensor<1x8x2x4xbf16>, tensor<1x2x8xf32>)"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("\"func.return\"(%v0#0)"), std::string::npos) << text;
}

// Stated layouts (cuDNN's attention declares its results [B, H, T, D] laid out as [B, T, H, D]): written as
// the MLIR attributes JAX writes; one per operand and result, each a permutation of its rank, or refused.
TEST(XlaHloBuilder, CustomCallLayouts) {
  HloBuilder b;
  Value q = b.argument({ElementType::kBF16, {1, 8, 2, 4}});
  CustomCallOptions o;
  o.operand_layouts = {{3, 2, 1, 0}};
  o.result_layouts = {{3, 1, 2, 0}, {0}};
  auto r = b.custom_call("t", {q}, {{ElementType::kBF16, {1, 2, 8, 4}}, {ElementType::kU8, {0}}}, o);
  b.returns({r[0]});
  const std::string text = b.module();
  EXPECT_NE(
      text.find("api_version = 2 : i32, operand_layouts = [dense<[3, 2, 1, 0]> : tensor<4xindex>], "
                "result_layouts = [dense<[3, 1, 2, 0]> : tensor<4xindex>, dense<0> : tensor<1xindex>]} : "
                "(tensor<1x8x2x4xbf16>) -> (tensor<1x2x8x4xbf16>, tensor<0xui8>)"),
      std::string::npos)
      << text;
  auto refused = [&](std::vector<std::vector<int64_t>> ol, std::vector<std::vector<int64_t>> rl) {
    HloBuilder b2;
    Value x = b2.argument({F32, {2, 3}});
    CustomCallOptions o2;
    o2.operand_layouts = std::move(ol);
    o2.result_layouts = std::move(rl);
    return error_of([&] { b2.custom_call("t", {x}, {{F32, {3}}, {F32, {2, 3}}}, o2); });
  };
  EXPECT_NE(refused({{1, 0}}, {{0}}).find("t: 1 result layouts for 2 results"), std::string::npos);
  EXPECT_NE(refused({}, {{0}, {1, 0}}).find("t: 0 operand layouts for 1 operands"), std::string::npos);
  EXPECT_NE(refused({{1, 1}}, {{0}, {1, 0}}).find("operand 0's layout [1, 1] is not a permutation of its 2"),
            std::string::npos);
  EXPECT_NE(refused({{1, 0}}, {{0}, {0}}).find("result 1's layout [0] is not a permutation of its 2"),
            std::string::npos);
}

TEST(XlaHloBuilder, CustomCallTextPassesThePluginsParserAndVerifier) {
  OLMOSFT_CPU_PLUGIN_ONLY();  // the CPU plugin's words for a missing handler
  // The CPU plugin has no handler for the target, so compiling fails, but only at the handler lookup: the
  // text parsed and verified (for both the string and the typed-FFI dictionary configuration).
  for (int api : {2, 4}) {
    HloBuilder b;
    Value x = b.argument({F32, {4}});
    CustomCallOptions o;
    o.api_version = api;
    o.backend_config = api == 4 ? "{eps = 1.0e-06 : f32}" : "opaque \x01 bytes";
    b.returns({b.custom_call("olmosft_no_such_target", {x}, {{F32, {4}}}, o)[0]});
    const std::string msg = error_of([&] { cpu().compile(b.module()); });
    EXPECT_NE(
        msg.find(api == 4 ? "No FFI handler registered for olmosft_no_such_target"
                          : "No registered implementation for untyped custom call to olmosft_no_such_target"),
        std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("Failed to parse"), std::string::npos) << msg;
  }
  HloBuilder b;
  Value x = b.argument({F32, {4}});
  CustomCallOptions o;
  o.api_version = 4;
  o.backend_config = "eps=1";
  EXPECT_NE(error_of([&] {
              b.custom_call("t", {x}, {{F32, {4}}}, o);
            }).find("MLIR dictionary attribute"),
            std::string::npos);
}

TEST(XlaHloBuilder, RefusesMismatchesClearly) {
  HloBuilder b;
  Value a = b.argument({F32, {2, 3}}), c = b.argument({F32, {3, 2}}), i = b.argument({S32, {2, 3}});
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  has(error_of([&] { b.add(a, c); }), "add: operand types differ: tensor<2x3xf32> and tensor<3x2xf32>");
  has(error_of([&] { b.mul(a, i); }), "operand types differ");
  has(error_of([&] { b.exp(i); }), "exponential needs a float operand, got tensor<2x3xi32>");
  has(error_of([&] {
        b.dot_general(a, a, {{}, {}, {1}, {0}});
      }),
      "lhs dimension 1 (size 3) pairs with rhs dimension 0 (size 2)");
  has(error_of([&] { b.dot_general(a, c, {{}, {}, {1, 1}, {0, 1}}); }), "listed twice");
  has(error_of([&] {
        b.broadcast_in_dim(a, {4, 3}, {0, 1});
      }),
      "operand dimension 0 (size 2) cannot broadcast");
  has(error_of([&] {
        b.reshape(a, {4, 2});
      }),
      "tensor<2x3xf32> (6 elements) cannot become tensor<4x2xf32> (8)");
  has(error_of([&] { b.transpose(a, {0, 0}); }), "listed twice");
  has(error_of([&] { b.slice(a, {0, 0}, {3, 3}); }), "dimension 0 [0, 3) step 1 out of range");
  has(error_of([&] { b.dynamic_slice(a, {b.scalar(F32, 0), b.scalar(F32, 0)}, {1, 1}); }), "integer scalars");
  has(error_of([&] { b.concatenate({a, c}, 0); }), "tensor<3x2xf32> does not match tensor<2x3xf32>");
  has(error_of([&] { b.reduce_sum(a, {2}); }), "reduced dimension 2 out of range");
  has(error_of([&] { b.select(b.compare(c, c, Compare::kEq), a, a); }),
      "must be a pred scalar or of shape [2, 3]");
  has(error_of([&] { b.constant({S32, {}}, 0.5); }), "0.5 is not a i32 value");
  std::optional<Value> inner;
  has(error_of([&] {
        b.while_loop(
            {b.scalar(F32, 0)},
            [&](HloBuilder& h, const std::vector<Value>& v) {
              inner = v[0];
              return std::vector<Value>{h.compare(v[0], v[0], Compare::kLt)};
            },
            [](HloBuilder& h, const std::vector<Value>& v) {
              return std::vector<Value>{h.convert(v[0], S32)};
            });
      }),
      "while_loop body value 0 is tensor<i32>, expected tensor<f32>");
  has(error_of([&] { b.neg(*inner); }), "is not visible here");
  HloBuilder other;
  has(error_of([&] { other.neg(a); }), "belongs to another builder");
  has(error_of([&] { b.module(); }), "module() before returns()");
  HloBuilder alias;
  Value x = alias.argument({F32, {2}}, 0);
  has(error_of([&] { alias.returns({alias.convert(x, ElementType::kF64)}); }),
      "aliases result 0 of another type");
}

TEST(XlaHloBuilder, SoftmaxCrossEntropyAndGradientMatchFloat64) {
  // loss = mean_n (logsumexp(z_n) - z_n[y_n]); dz = (softmax(z) - onehot(y)) / N.
  const int64_t N = 8, V = 50;
  const auto z = randu(N * V, -6, 6, 13);
  std::vector<int32_t> y(N);
  for (int64_t n = 0; n < N; ++n) y[n] = int32_t((n * 17 + 3) % V);
  HloBuilder b("softmax_xent");
  const TensorType tz{F32, {N, V}};
  Value Z = b.argument(tz), Y = b.argument({S32, {N}});
  Value zmax = b.broadcast_in_dim(b.reduce_max(Z, {1}), {N, V}, {0});
  Value e = b.exp(b.sub(Z, zmax));
  Value lse = b.add(b.log(b.reduce_sum(e, {1})), b.reduce_max(Z, {1}));  // [N]
  Value onehot = b.compare(b.iota({S32, {N, V}}, 1), b.broadcast_in_dim(Y, {N, V}, {0}), Compare::kEq);
  Value picked = b.reduce_sum(b.select(onehot, Z, b.constant(tz, 0)), {1});
  Value inv_n = b.scalar(F32, 1.0 / double(N));
  Value loss = b.mul(b.reduce_sum(b.sub(lse, picked), {0}), inv_n);
  Value p = b.exp(b.sub(Z, b.broadcast_in_dim(lse, {N, V}, {0})));
  Value grad = b.mul(b.sub(p, b.convert(onehot, F32)), b.broadcast_in_dim(inv_n, {N, V}, {}));
  b.returns({loss, grad});
  auto out = run(b, {{z.data(), tz}, {y.data(), {S32, {N}}}});
  double want = 0;
  std::vector<double> dz(size_t(N * V));
  for (int64_t n = 0; n < N; ++n) {
    double m = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double(z[n * V + v]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(double(z[n * V + v]) - m);
    const double l = m + std::log(s);
    want += (l - z[n * V + y[n]]) / double(N);
    for (int64_t v = 0; v < V; ++v)
      dz[size_t(n * V + v)] = (std::exp(double(z[n * V + v]) - l) - (v == y[n] ? 1.0 : 0.0)) / double(N);
  }
  const float loss_got = out[0].to_host<float>()[0];
  EXPECT_NEAR(loss_got, want, 1e-6 * std::fabs(want) + 1e-6);
  const auto g = out[1].to_host<float>();
  double max_err = 0;
  for (size_t i = 0; i < g.size(); ++i) max_err = std::max(max_err, std::fabs(g[i] - dz[i]));
  EXPECT_LT(max_err, 1e-6 / double(N)) << "max |grad - float64| " << max_err;
  std::cout << "softmax CE: loss " << loss_got << " vs float64 " << want << ", max grad error " << max_err
            << "\n";
}
