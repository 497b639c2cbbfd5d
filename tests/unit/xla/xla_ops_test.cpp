// The StableHLO layer ops (src/xla/ops_*.h): each forward and backward compiled by XLA's CPU plugin and run
// against the CPU kernel of src/kernels on the same random inputs, and against float64 (the kernels' double
// instantiation, a naive float64 reference, or float64 finite differences where the CPU kernel is not an
// independent reference: the grouped RMSNorm).
//
// Errors are measured as max |got - want| / max |want| over the tensor (relative to the tensor's scale) and
// printed. Tolerances, and why:
//   - elementwise f32 chains (RMSNorm's scaling, SwiGLU, RoPE, AdamW): a few f32 roundings that XLA may order
//   or
//     contract differently from the C++ loops, and XLA's own exp (1e-6 relative, xla_hlo_builder_test): 2e-6.
//   - reductions in f32 (RMSNorm's row sums, which the CPU kernel accumulates in double; dot products; the
//     global norm) in XLA's summation order: 1e-5 of the tensor's scale.
//   - blockwise attention and the tiled cross-entropy: f32 online softmax with a different block order and
//     summation order than the CPU kernel (and f32 against float64): 2e-5 of the tensor's scale.
//   - bf16 operands: against float64 on the bf16-rounded operands (products are exact in f32): 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <random>

#include "../kernels/attn_util.h"
#include "core/bf16.h"
#include "kernels/adamw.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "xla/ops_adamw.h"
#include "xla/ops_attention.h"
#include "xla/ops_dense.h"
#include "xla/ops_xent.h"
#include "xla/pjrt.h"
#include "xla_test_util.h"

using namespace olmosft;
using namespace olmosft::xla;

namespace {

constexpr ElementType F32 = ElementType::kF32;
constexpr ElementType S32 = ElementType::kS32;

Client& cpu() { return testutil::test_client(1); }
using testutil::error_of;

std::vector<float> randu(size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// A host array with its type, for run().
struct Arg {
  const void* data;
  TensorType type;
};
template <typename T>
Arg arg(const std::vector<T>& v, std::vector<int64_t> dims) {
  const ElementType t = std::is_same_v<T, float> ? F32 : S32;
  return {v.data(), TensorType{t, std::move(dims)}};
}

// Builds a module whose arguments have ARGS's types with BODY, compiles it and runs it on ARGS.
std::vector<Buffer> run(
    const std::vector<Arg>& args,
    const std::function<std::vector<Value>(HloBuilder&, const std::vector<Value>&)>& body) {
  HloBuilder b;
  std::vector<Value> in;
  for (const Arg& a : args) in.push_back(b.argument(a.type));
  b.returns(body(b, in));
  Client& c = cpu();
  Executable exe = c.compile(b.module());
  std::vector<Buffer> bufs;
  for (const Arg& a : args) bufs.push_back(c.to_device(a.data, a.type));
  std::vector<Buffer*> ptrs;
  for (Buffer& x : bufs) ptrs.push_back(&x);
  return exe.execute(ptrs);
}

// max |got - want| / max |want| (the tensor's scale); infinities must match exactly. Prints and checks it.
template <typename W>
double expect_close(const std::vector<float>& got, const std::vector<W>& want, double tol,
                    const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double scale = 0, err = 0;
  for (const W& w : want)
    if (std::isfinite(double(w))) scale = std::max(scale, std::fabs(double(w)));
  scale = std::max(scale, 1e-30);
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (!std::isfinite(double(want[i]))) {
      EXPECT_EQ(double(got[i]), double(want[i])) << what << " at " << i;
      continue;
    }
    const double e = std::fabs(double(got[i]) - double(want[i])) / scale;
    if (!(e <= tol)) ADD_FAILURE() << what << " at " << i << ": got " << got[i] << ", want " << want[i];
    err = std::max(err, e);
  }
  std::cout << what << ": max error " << err << " of the scale " << scale << " (allowed " << tol << ")\n";
  return err;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Central finite differences of F at X (float64).
std::vector<double> fd_grad(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
                            double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

}  // namespace

TEST(XlaOps, RmsNormMatchesTheCpuKernel) {
  const int64_t N = 6, D = 48;
  const double eps = 1e-6;
  const auto x = randu(N * D, -2, 2, 1), w = randu(D, 0.5f, 1.5f, 2), dy = randu(N * D, -1, 1, 3);
  auto out =
      run({arg(x, {N, D}), arg(w, {D}), arg(dy, {N, D})}, [&](HloBuilder& b, const std::vector<Value>& a) {
        const auto f = ops::rmsnorm_forward(b, a[0], a[1], eps);
        const auto g = ops::rmsnorm_backward(b, a[2], a[0], a[1], f.rstd);
        const auto f0 = ops::rmsnorm_forward(b, a[0], std::nullopt, eps);  // without a gain
        const auto g0 = ops::rmsnorm_backward(b, a[2], a[0], std::nullopt, f0.rstd);
        return std::vector<Value>{f.y, f.rstd, g.dx, *g.dw, f0.y, g0.dx};
      });
  std::vector<float> y(N * D), r(N), dx(N * D), dw(D, 0.0f), y0(N * D), dx0(N * D);
  rmsnorm_forward<float>(x.data(), w.data(), y.data(), r.data(), N, D, eps);
  rmsnorm_backward<float>(dy.data(), x.data(), w.data(), r.data(), dx.data(), dw.data(), N, D, eps);
  rmsnorm_forward<float>(x.data(), nullptr, y0.data(), nullptr, N, D, eps);
  rmsnorm_backward<float>(dy.data(), x.data(), nullptr, nullptr, dx0.data(), nullptr, N, D, eps);
  expect_close(out[0].to_host<float>(), y, 2e-6, "rmsnorm y");
  expect_close(out[1].to_host<float>(), r, 2e-6, "rmsnorm rstd");
  expect_close(out[2].to_host<float>(), dx, 1e-5, "rmsnorm dx");
  expect_close(out[3].to_host<float>(), dw, 1e-5, "rmsnorm dw");
  expect_close(out[4].to_host<float>(), y0, 2e-6, "rmsnorm y (no gain)");
  expect_close(out[5].to_host<float>(), dx0, 1e-5, "rmsnorm dx (no gain)");
}

// The grouped form has no CPU kernel with one gain over all groups: float64 forward formula and float64
// finite differences of L = sum(y * dy) for dx and dw.
TEST(XlaOps, GroupedRmsNormMatchesFloat64AndFiniteDifferences) {
  const int64_t N = 3, G = 4, Dg = 6, D = G * Dg;
  const double eps = 1e-5;
  const auto x = randu(N * D, -2, 2, 4), w = randu(D, 0.5f, 1.5f, 5), dy = randu(N * D, -1, 1, 6);
  auto out =
      run({arg(x, {N, D}), arg(w, {D}), arg(dy, {N, D})}, [&](HloBuilder& b, const std::vector<Value>& a) {
        const auto f = ops::rmsnorm_forward(b, a[0], a[1], eps, G);
        const auto g = ops::rmsnorm_backward(b, a[2], a[0], a[1], f.rstd, G);
        return std::vector<Value>{f.y, f.rstd, g.dx, *g.dw};
      });
  EXPECT_EQ(out[1].type(), (TensorType{F32, {N, G}}));
  auto forward = [&](const std::vector<double>& xx, const std::vector<double>& ww, std::vector<double>* rs) {
    std::vector<double> yy(size_t(N * D));
    for (int64_t i = 0; i < N; ++i)
      for (int64_t g = 0; g < G; ++g) {
        double ss = 0;
        for (int64_t j = 0; j < Dg; ++j) ss += xx[(i * G + g) * Dg + j] * xx[(i * G + g) * Dg + j];
        const double r = 1 / std::sqrt(ss / double(Dg) + eps);
        if (rs) rs->push_back(r);
        for (int64_t j = 0; j < Dg; ++j)
          yy[(i * G + g) * Dg + j] = ww[g * Dg + j] * xx[(i * G + g) * Dg + j] * r;
      }
    return yy;
  };
  const std::vector<double> xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
  std::vector<double> rd;
  const std::vector<double> yd = forward(xd, wd, &rd);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    const auto yy = forward(xx, ww, nullptr);
    double s = 0;
    for (size_t i = 0; i < yy.size(); ++i) s += yy[i] * dyd[i];
    return s;
  };
  const auto dxd = fd_grad([&](const std::vector<double>& v) { return loss(v, wd); }, xd);
  const auto dwd = fd_grad([&](const std::vector<double>& v) { return loss(xd, v); }, wd);
  expect_close(out[0].to_host<float>(), yd, 2e-6, "grouped rmsnorm y vs float64");
  expect_close(out[1].to_host<float>(), rd, 2e-6, "grouped rmsnorm rstd vs float64");
  // Finite differences in float64 with h = 1e-6 are good to about 1e-9; the f32 gradient to 1e-5.
  expect_close(out[2].to_host<float>(), dxd, 1e-5, "grouped rmsnorm dx vs float64 finite differences");
  expect_close(out[3].to_host<float>(), dwd, 1e-5, "grouped rmsnorm dw vs float64 finite differences");
}

TEST(XlaOps, SwigluMatchesTheCpuKernel) {
  const int64_t N = 5, F = 40;
  const auto a = randu(N * F, -6, 6, 7), u = randu(N * F, -2, 2, 8), dh = randu(N * F, -1, 1, 9);
  auto out =
      run({arg(a, {N, F}), arg(u, {N, F}), arg(dh, {N, F})}, [&](HloBuilder& b, const std::vector<Value>& v) {
        const auto g = ops::swiglu_backward(b, v[2], v[0], v[1]);
        return std::vector<Value>{ops::swiglu_forward(b, v[0], v[1]), g.da, g.db};
      });
  std::vector<float> h(N * F), da(N * F), db(N * F);
  swiglu_forward<float>(a.data(), u.data(), h.data(), N * F);
  swiglu_backward<float>(dh.data(), a.data(), u.data(), da.data(), db.data(), N * F);
  expect_close(out[0].to_host<float>(), h, 2e-6, "swiglu h");
  expect_close(out[1].to_host<float>(), da, 2e-6, "swiglu da");
  expect_close(out[2].to_host<float>(), db, 2e-6, "swiglu db");
}

TEST(XlaOps, LinearMatchesTheCpuKernelAndBf16MatchesFloat64) {
  const int64_t A = 2, R = 3, N = A * R, in = 24, out = 10;
  const auto x = randu(N * in, -1, 1, 10), w = randu(out * in, -1, 1, 11), dy = randu(N * out, -1, 1, 12);
  auto res = run({arg(x, {A, R, in}), arg(w, {out, in}), arg(dy, {A, R, out})},
                 [&](HloBuilder& b, const std::vector<Value>& v) {
                   std::vector<Value> r;
                   for (auto o : {ops::Operands::kF32, ops::Operands::kBF16}) {
                     const auto g = ops::linear_backward(b, v[2], v[0], v[1], o);
                     r.insert(r.end(), {ops::linear_forward(b, v[0], v[1], o), g.dx, g.dw});
                   }
                   return r;
                 });
  EXPECT_EQ(res[0].type(), (TensorType{F32, {A, R, out}}));
  EXPECT_EQ(res[2].type(), (TensorType{F32, {out, in}}));
  std::vector<float> y(N * out), dx(N * in), dw(out * in, 0.0f);
  linear_forward<float>(x.data(), w.data(), y.data(), N, in, out);
  linear_backward<float>(dy.data(), x.data(), w.data(), dx.data(), dw.data(), N, in, out);
  expect_close(res[0].to_host<float>(), y, 1e-5, "linear y (f32)");
  expect_close(res[1].to_host<float>(), dx, 1e-5, "linear dx (f32)");
  expect_close(res[2].to_host<float>(), dw, 1e-5, "linear dW (f32)");
  // bf16 operands: float64 on the rounded operands.
  auto rnd = [](const std::vector<float>& v) {
    std::vector<double> r;
    for (float f : v) r.push_back(double(bf16_to_f32(f32_to_bf16(f))));
    return r;
  };
  const auto xr = rnd(x), wr = rnd(w), dyr = rnd(dy);
  std::vector<double> y64(N * out, 0), dx64(N * in, 0), dw64(out * in, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        y64[n * out + o] += xr[n * in + i] * wr[o * in + i];
        dx64[n * in + i] += dyr[n * out + o] * wr[o * in + i];
        dw64[o * in + i] += dyr[n * out + o] * xr[n * in + i];
      }
  expect_close(res[3].to_host<float>(), y64, 1e-5, "linear y (bf16 operands) vs float64");
  expect_close(res[4].to_host<float>(), dx64, 1e-5, "linear dx (bf16 operands) vs float64");
  expect_close(res[5].to_host<float>(), dw64, 1e-5, "linear dW (bf16 operands) vs float64");
}

// Default RoPE and YaRN, positions restarting per packed document; the tables, forward and backward against
// kernels/rope on the same inv_freq.
TEST(XlaOps, RopeAndYarnMatchTheCpuKernel) {
  const int64_t H = 3, D = 32, half = D / 2;
  std::vector<int32_t> pos;
  for (int len : {9, 17, 6})
    for (int p = 0; p < len; ++p) pos.push_back(p + (len == 6 ? 3000 : 0));
  const int64_t T = int64_t(pos.size());
  RopeConfig def;
  def.theta = 500000;
  def.head_dim = D;
  RopeConfig yarn = def;
  yarn.rope_type = "yarn";
  yarn.factor = 8;
  yarn.original_max_position_embeddings = 8192;
  yarn.max_position_embeddings = 65536;
  const auto x = randu(T * H * D, -1, 1, 13), dy = randu(T * H * D, -1, 1, 14);
  for (const RopeConfig& cfg : {def, yarn}) {
    const RopeFreqs f = rope_frequencies(cfg);
    // inv_freq as an argument (default) and as a constant of the graph (YaRN).
    const bool as_constant = cfg.rope_type == "yarn";
    auto out = run({arg(x, {T, H, D}), arg(dy, {T, H, D}), arg(pos, {T}), arg(f.inv_freq, {half})},
                   [&](HloBuilder& b, const std::vector<Value>& v) {
                     const Value inv = as_constant ? ops::rope_inv_freq_constant(b, f.inv_freq) : v[3];
                     const auto t = ops::rope_tables(b, v[2], inv, f.attention_scaling);
                     return std::vector<Value>{t.cos, t.sin, ops::rope_forward(b, v[0], t),
                                               ops::rope_backward(b, v[1], t)};
                   });
    RopeTable<float> tab;
    tab.build(f, pos.data(), T);
    std::vector<float> y = x, dx = dy;
    rope_forward<float>(y.data(), tab.cos.data(), tab.sin.data(), T, H, D, H * D);
    rope_backward<float>(dx.data(), tab.cos.data(), tab.sin.data(), T, H, D, H * D);
    const std::string n = cfg.rope_type;
    // The tables: f32 product, f64 trigonometry rounded once, as the kernel: measured bit-exact; allowed
    // 1 float ulp of 1 (XLA's f64 cos/sin against libm's).
    expect_close(out[0].to_host<float>(), tab.cos, 1.2e-7, n + " rope cos table");
    expect_close(out[1].to_host<float>(), tab.sin, 1.2e-7, n + " rope sin table");
    expect_close(out[2].to_host<float>(), y, 2e-6, n + " rope forward");
    expect_close(out[3].to_host<float>(), dx, 2e-6, n + " rope backward");
  }
}

// The CPU kernel's (and the float64 reference's) attention shape.
static AttentionConfig attention_config(int64_t batch, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                        int64_t Dv, int64_t window, double scale) {
  AttentionConfig c;
  c.batch = batch;
  c.seq = T;
  c.heads = H;
  c.kv_heads = Hkv;
  c.head_dim = D;
  c.v_head_dim = Dv;
  c.window = window;
  c.scale = scale;
  return c;
}

// Packed rows with several documents and padding (in the middle and at the end), GQA (H = 2 Hkv), Dv != D,
// full causal and sliding windows (wider and narrower than a block), T not a multiple of the block: out, lse,
// dq, dk, dv against the CPU kernel (float) and the naive float64 reference of attn_util.h (a materialised T
// x T mask).
TEST(XlaOps, BlockwiseAttentionMatchesTheCpuKernelAndFloat64) {
  const int64_t T = 100, H = 4, Hkv = 2, D = 16, Dv = 12;
  const std::vector<int32_t> seg = attn_test::segments({30, 41, -3, 18, -8});
  ASSERT_EQ(int64_t(seg.size()), T);
  const auto qd = attn_test::randn(T * H * D, 1), kd = attn_test::randn(T * Hkv * D, 2),
             vd = attn_test::randn(T * Hkv * Dv, 3), dod = attn_test::randn(T * H * Dv, 4);
  const auto q = attn_test::cast<float>(qd), k = attn_test::cast<float>(kd), v = attn_test::cast<float>(vd),
             dout = attn_test::cast<float>(dod);
  for (int64_t window : {int64_t(0), int64_t(24), int64_t(5)}) {
    const AttentionConfig c = attention_config(1, T, H, Hkv, D, Dv, window, 1.0 / std::sqrt(double(D)));
    const ops::AttentionOptions o{c.scale, window, 16};
    auto out = run(
        {arg(q, {T, H, D}), arg(k, {T, Hkv, D}), arg(v, {T, Hkv, Dv}), arg(seg, {T}), arg(dout, {T, H, Dv})},
        [&](HloBuilder& b, const std::vector<Value>& a) {
          const auto f = ops::attention_forward(b, a[0], a[1], a[2], a[3], o);
          const auto g = ops::attention_backward(b, a[0], a[1], a[2], a[3], f.out, f.lse, a[4], o);
          return std::vector<Value>{f.out, f.lse, g.dq, g.dk, g.dv};
        });
    EXPECT_EQ(out[1].type(), (TensorType{F32, {H, T}}));
    const auto cpu32 = attn_test::run_kernel<float>(c, q, k, v, seg, dout);
    const auto ref64 = attn_test::naive(c, to_double(q), to_double(k), to_double(v), seg, to_double(dout));
    const std::string w = " (window " + std::to_string(window) + ")";
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    const std::vector<float>* c32[] = {&cpu32.o, &cpu32.lse, &cpu32.dq, &cpu32.dk, &cpu32.dv};
    const std::vector<double>* r64[] = {&ref64.o, &ref64.lse, &ref64.dq, &ref64.dk, &ref64.dv};
    for (int i = 0; i < 5; ++i) {
      const auto got = out[size_t(i)].to_host<float>();
      expect_close(got, *c32[i], 2e-5, std::string("attention ") + names[i] + w + " vs CPU kernel");
      expect_close(got, *r64[i], 2e-5, std::string("attention ") + names[i] + w + " vs float64");
    }
  }
}

// Operands kBF16 (compute.dtype bf16): the same packed rows, inputs already bf16 (so rounding them changes
// nothing, and D = 16 makes the scale 1/4 exact), against float64 on those inputs. What remains is the
// rounding of P and dS to bf16 before their products (2^-9 relative per element, summed over up to a
// document's keys with random signs): measured 7.2e-4..2.7e-3 of each tensor's scale, allowed 1e-2 (the
// f32 path: 2e-7); at least 1e-4, so a path that forgot to round P and dS fails. lse has no rounded product
// after q k^T (exact in f32 from bf16 inputs), so it stays at f32 accuracy. Every product of the graph takes
// bf16 operands (no f32 product at HIGHEST precision is left).
TEST(XlaOps, BlockwiseAttentionWithBf16OperandsStaysNearFloat64) {
  const int64_t T = 100, H = 4, Hkv = 2, D = 16, Dv = 12;
  const std::vector<int32_t> seg = attn_test::segments({30, 41, -3, 18, -8});
  auto rounded = [](const std::vector<double>& x) {
    std::vector<float> r;
    for (double v : x) r.push_back(bf16_to_f32(f32_to_bf16(float(v))));
    return r;
  };
  const auto q = rounded(attn_test::randn(T * H * D, 1)), k = rounded(attn_test::randn(T * Hkv * D, 2)),
             v = rounded(attn_test::randn(T * Hkv * Dv, 3)), dout = rounded(attn_test::randn(T * H * Dv, 4));
  for (int64_t window : {int64_t(0), int64_t(24)}) {
    const AttentionConfig c = attention_config(1, T, H, Hkv, D, Dv, window, 0.25);
    ops::AttentionOptions o{c.scale, window, 16};
    o.operands = ops::Operands::kBF16;
    const auto graph = [&](HloBuilder& b, const std::vector<Value>& a) {
      const auto f = ops::attention_forward(b, a[0], a[1], a[2], a[3], o);
      const auto g = ops::attention_backward(b, a[0], a[1], a[2], a[3], f.out, f.lse, a[4], o);
      return std::vector<Value>{f.out, f.lse, g.dq, g.dk, g.dv};
    };
    const std::vector<Arg> args{arg(q, {T, H, D}), arg(k, {T, Hkv, D}), arg(v, {T, Hkv, Dv}), arg(seg, {T}),
                                arg(dout, {T, H, Dv})};
    auto out = run(args, graph);
    HloBuilder mb;
    std::vector<Value> in;
    for (const Arg& a : args) in.push_back(mb.argument(a.type));
    mb.returns(graph(mb, in));
    const std::string module = mb.module();
    EXPECT_EQ(module.find("HIGHEST"), std::string::npos) << "an f32 product is left";
    size_t bf16_products = 0;
    for (size_t i = 0; (i = module.find("stablehlo.dot_general", i)) != std::string::npos; ++i)
      bf16_products += module.substr(i, module.find('\n', i) - i).find("bf16>, tensor<") != std::string::npos;
    EXPECT_EQ(bf16_products, 7u) << "q k^T and P V forward; q k^T, P^T dO, dO V^T, dS^T q, dS k backward";
    const auto ref64 = attn_test::naive(c, to_double(q), to_double(k), to_double(v), seg, to_double(dout));
    const std::string w = " (bf16 operands, window " + std::to_string(window) + ")";
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    const std::vector<double>* r64[] = {&ref64.o, &ref64.lse, &ref64.dq, &ref64.dk, &ref64.dv};
    for (int i = 0; i < 5; ++i) {
      const double err = expect_close(out[size_t(i)].to_host<float>(), *r64[i], i == 1 ? 2e-5 : 1e-2,
                                      std::string("attention ") + names[i] + w + " vs float64");
      if (i != 1) {
        EXPECT_GT(err, 1e-4) << names[i] << w << ": P and dS not rounded to bf16?";
      }
    }
  }
}

// Two packed rows ([B, T, ...]: the CPU kernel's layouts), with different documents (ids repeating across
// rows) and padding, GQA and a window, against the CPU kernel with batch 2 and the naive float64 reference.
TEST(XlaOps, BatchedAttentionMatchesTheCpuKernelAndFloat64) {
  const int64_t B = 2, T = 40, H = 4, Hkv = 2, D = 8, Dv = 8;
  std::vector<int32_t> seg = attn_test::segments({15, 20, -5});
  const auto row1 = attn_test::segments({-2, 38});
  seg.insert(seg.end(), row1.begin(), row1.end());
  ASSERT_EQ(int64_t(seg.size()), B * T);
  const auto q = attn_test::cast<float>(attn_test::randn(B * T * H * D, 5)),
             k = attn_test::cast<float>(attn_test::randn(B * T * Hkv * D, 6)),
             v = attn_test::cast<float>(attn_test::randn(B * T * Hkv * Dv, 7)),
             dout = attn_test::cast<float>(attn_test::randn(B * T * H * Dv, 8));
  const AttentionConfig c = attention_config(B, T, H, Hkv, D, Dv, 12, 1.0 / std::sqrt(double(D)));
  const ops::AttentionOptions o{c.scale, c.window, 16};
  auto out = run({arg(q, {B, T, H, D}), arg(k, {B, T, Hkv, D}), arg(v, {B, T, Hkv, Dv}), arg(seg, {B, T}),
                  arg(dout, {B, T, H, Dv})},
                 [&](HloBuilder& b, const std::vector<Value>& a) {
                   const auto f = ops::attention_forward(b, a[0], a[1], a[2], a[3], o);
                   const auto g = ops::attention_backward(b, a[0], a[1], a[2], a[3], f.out, f.lse, a[4], o);
                   return std::vector<Value>{f.out, f.lse, g.dq, g.dk, g.dv};
                 });
  EXPECT_EQ(out[1].type(), (TensorType{F32, {B, H, T}}));
  const auto cpu32 = attn_test::run_kernel<float>(c, q, k, v, seg, dout);
  const auto ref64 = attn_test::naive(c, to_double(q), to_double(k), to_double(v), seg, to_double(dout));
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  const std::vector<float>* c32[] = {&cpu32.o, &cpu32.lse, &cpu32.dq, &cpu32.dk, &cpu32.dv};
  const std::vector<double>* r64[] = {&ref64.o, &ref64.lse, &ref64.dq, &ref64.dk, &ref64.dv};
  for (int i = 0; i < 5; ++i) {
    const auto got = out[size_t(i)].to_host<float>();
    expect_close(got, *c32[i], 2e-5, std::string("batched attention ") + names[i] + " vs CPU kernel");
    expect_close(got, *r64[i], 2e-5, std::string("batched attention ") + names[i] + " vs float64");
  }
}

// The LM head + cross-entropy with z-loss over vocab tiles (a chunk that does not divide the vocabulary),
// padded rows of W, masked and ignored tokens: the sums, lse, dh and dW against the CPU kernel (float) and
// its float64 instantiation.
TEST(XlaOps, TiledCrossEntropyMatchesTheCpuKernelAndFloat64) {
  const int64_t N = 24, d = 16, Vr = 70, V = 67;
  const auto h = randu(N * d, -1, 1, 15), w = randu(Vr * d, -1, 1, 16);
  std::vector<int32_t> tg(N), mask(N, 1);
  std::vector<uint8_t> mask8(N, 1);
  std::mt19937 gen(17);
  for (int64_t i = 0; i < N; ++i) tg[i] = int32_t(gen() % V);
  tg[3] = -100;
  tg[10] = V - 1;
  mask[5] = mask[6] = 0;
  mask8[5] = mask8[6] = 0;
  XentConfig cfg;
  cfg.valid_vocab = V;
  cfg.z_loss = 1e-2;
  cfg.vocab_chunk = 16;
  std::vector<float> lse(N);
  const XentStats st =
      xent_forward<float>(h.data(), w.data(), tg.data(), mask8.data(), N, d, Vr, cfg, lse.data());
  const float scale = float(1.0 / double(st.count));
  std::vector<float> dh(N * d), dw(Vr * d, 0.0f);
  xent_backward<float>(h.data(), w.data(), tg.data(), mask8.data(), lse.data(), N, d, Vr, cfg, scale,
                       dh.data(), dw.data());
  std::vector<double> lse64(N), dh64(N * d), dw64(Vr * d, 0.0);
  const auto h64 = to_double(h), w64 = to_double(w);
  const XentStats st64 =
      xent_forward<double>(h64.data(), w64.data(), tg.data(), mask8.data(), N, d, Vr, cfg, lse64.data());
  xent_backward<double>(h64.data(), w64.data(), tg.data(), mask8.data(), lse64.data(), N, d, Vr, cfg, scale,
                        dh64.data(), dw64.data());
  const std::vector<float> sc{scale};
  // Tiles of 16 (the last one overlaps the one before: 67 = 4 x 16 + 3) and the whole vocabulary at once.
  for (int64_t chunk : {int64_t(16), int64_t(0)}) {
    const ops::XentOptions o{V, cfg.z_loss, chunk, -100};
    const std::string n = "xent (chunk " + std::to_string(chunk) + ") ";
    auto out = run({arg(h, {N, d}), arg(w, {Vr, d}), arg(tg, {N}), arg(mask, {N}), arg(sc, {})},
                   [&](HloBuilder& b, const std::vector<Value>& a) {
                     const auto f = ops::xent_forward(b, a[0], a[1], a[2], a[3], o);
                     const auto g = ops::xent_backward(b, a[0], a[1], a[2], a[3], f.lse, a[4], o);
                     return std::vector<Value>{f.ce_sum, f.z_sum, f.count, f.lse, g.dh, g.dw};
                   });
    EXPECT_EQ(out[2].to_host<int32_t>()[0], st.count);
    EXPECT_EQ(st.count, N - 3);
    expect_close(out[0].to_host<float>(), std::vector<double>{st.ce_sum}, 2e-5, n + "ce_sum vs CPU kernel");
    expect_close(out[0].to_host<float>(), std::vector<double>{st64.ce_sum}, 2e-5, n + "ce_sum vs float64");
    expect_close(out[1].to_host<float>(), std::vector<double>{st.z_sum}, 2e-5, n + "z_sum vs CPU kernel");
    expect_close(out[1].to_host<float>(), std::vector<double>{st64.z_sum}, 2e-5, n + "z_sum vs float64");
    expect_close(out[3].to_host<float>(), lse, 2e-5, n + "lse vs CPU kernel");
    expect_close(out[3].to_host<float>(), lse64, 2e-5, n + "lse vs float64");
    expect_close(out[4].to_host<float>(), dh, 2e-5, n + "dh vs CPU kernel");
    expect_close(out[4].to_host<float>(), dh64, 2e-5, n + "dh vs float64");
    expect_close(out[5].to_host<float>(), dw, 2e-5, n + "dW vs CPU kernel");
    expect_close(out[5].to_host<float>(), dw64, 2e-5, n + "dW vs float64");
  }
}

// Clip (active, then inactive) and two AdamW steps on two tensors (one without weight decay), against
// kernels/adamw.
TEST(XlaOps, ClipAndAdamWMatchTheCpuKernel) {
  const int64_t n0 = 300, n1 = 37;
  ops::AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  AdamWConfig cfg{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  std::vector<float> p0 = randu(n0, -1, 1, 18), p1 = randu(n1, -1, 1, 19), m0(n0, 0), m1(n1, 0), v0(n0, 0),
                     v1(n1, 0);
  for (int64_t step : {int64_t(1), int64_t(2)}) {
    const double max_norm = step == 1 ? 0.5 : 100.0;  // clips on step 1, not on step 2
    const auto g0 = randu(n0, -0.2f, 0.2f, 20 + unsigned(step)),
               g1 = randu(n1, -0.2f, 0.2f, 30 + unsigned(step));
    const auto sa = ops::adamw_scalars(o, step);
    const std::vector<float> scal(sa.begin(), sa.end());
    auto out =
        run({arg(p0, {n0}), arg(g0, {n0}), arg(m0, {n0}), arg(v0, {n0}), arg(p1, {n1}), arg(g1, {n1}),
             arg(m1, {n1}), arg(v1, {n1}), arg(scal, {3})},
            [&](HloBuilder& b, const std::vector<Value>& a) {
              const auto c = ops::clip_grad_norm(b, {a[1], a[5]}, max_norm);
              const auto s = ops::adamw_update(
                  b, {{a[0], c.grads[0], a[2], a[3], true}, {a[4], c.grads[1], a[6], a[7], false}}, a[8], o);
              return std::vector<Value>{c.norm, s[0].p, s[0].m, s[0].v, s[1].p, s[1].m, s[1].v};
            });
    auto cg0 = g0, cg1 = g1;
    std::vector<AdamWParam<float>> ps{{p0.data(), cg0.data(), m0.data(), v0.data(), n0, true},
                                      {p1.data(), cg1.data(), m1.data(), v1.data(), n1, false}};
    const double norm = clip_grad_norm(ps, max_norm);
    adamw_step(ps, cfg, step);
    const std::string s = " (step " + std::to_string(step) + ")";
    expect_close(out[0].to_host<float>(), std::vector<double>{norm}, 1e-5, "global grad norm" + s);
    const std::vector<float>* want[] = {&p0, &m0, &v0, &p1, &m1, &v1};
    const char* names[] = {"p (decay)",    "m (decay)",    "v (decay)",
                           "p (no decay)", "m (no decay)", "v (no decay)"};
    for (int i = 0; i < 6; ++i)
      expect_close(out[size_t(i) + 1].to_host<float>(), *want[i], 2e-6, std::string("adamw ") + names[i] + s);
  }
}

namespace {
// The largest tensor (in elements) named anywhere in a module's text.
int64_t largest_tensor(const std::string& text) {
  int64_t best = 0;
  for (size_t at = text.find("tensor<"); at != std::string::npos; at = text.find("tensor<", at + 1)) {
    int64_t n = 1;
    size_t i = at + 7;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      size_t end = i;
      while (std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      n *= std::stoll(text.substr(i, end - i));
      i = end + 1;  // past the 'x'
    }
    best = std::max(best, n);
  }
  return best;
}
}  // namespace

// Memory: no T x T tensor in the attention graphs (the largest is q, dq, the [H, block, block] scores or a
// [block, T] comparison), no N x V one in the cross-entropy graphs (the largest is W or the [N, chunk] logits
// tile).
TEST(XlaOps, AttentionAndCrossEntropyGraphsHoldNoQuadraticTensor) {
  const int64_t T = 512, H = 2, Hkv = 1, D = 8, Bk = 32;
  HloBuilder b;
  const Value q = b.argument({F32, {T, H, D}}), k = b.argument({F32, {T, Hkv, D}}),
              v = b.argument({F32, {T, Hkv, D}}), seg = b.argument({S32, {T}}),
              dout = b.argument({F32, {T, H, D}});
  const ops::AttentionOptions o{0.35, 0, Bk};
  const auto f = ops::attention_forward(b, q, k, v, seg, o);
  const auto g = ops::attention_backward(b, q, k, v, seg, f.out, f.lse, dout, o);
  b.returns({f.out, f.lse, g.dq, g.dk, g.dv});
  const int64_t att = largest_tensor(b.module());
  std::cout << "attention graph: largest tensor " << att << " elements (T x T = " << T * T << ")\n";
  // q / dq, the [H, block, block] scores, or the [block, T] document-extent comparison of one block
  EXPECT_EQ(att, std::max({H * T * D, H * Bk * Bk, Bk * T}));
  const int64_t N = 64, d = 16, V = 1000, C = 128;
  HloBuilder x;
  const Value h = x.argument({F32, {N, d}}), w = x.argument({F32, {V, d}}), t = x.argument({S32, {N}}),
              m = x.argument({S32, {N}}), s = x.argument({F32, {}});
  const ops::XentOptions xo{V, 1e-4, C, -100};
  const auto xf = ops::xent_forward(x, h, w, t, m, xo);
  const auto xb = ops::xent_backward(x, h, w, t, m, xf.lse, s, xo);
  x.returns({xf.ce_sum, xb.dh, xb.dw});
  const int64_t xe = largest_tensor(x.module());
  std::cout << "cross-entropy graph: largest tensor " << xe << " elements (N x V = " << N * V << ")\n";
  EXPECT_EQ(xe, V * d);  // W itself (and dW)
}

TEST(XlaOps, RefusesMismatchedShapesClearly) {
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  HloBuilder b;
  const Value x = b.argument({F32, {4, 6}}), w5 = b.argument({F32, {5}}), q = b.argument({F32, {8, 3, 4}}),
              k = b.argument({F32, {8, 2, 4}}), seg = b.argument({S32, {8}}), pos = b.argument({S32, {8}}),
              inv = b.argument({F32, {3}}), t4 = b.argument({S32, {4}});
  has(error_of([&] { ops::rmsnorm_forward(b, x, w5, 1e-6); }),
      "rmsnorm_forward: w must have dims [6], got tensor<5xf32>");
  has(error_of([&] { ops::rmsnorm_forward(b, x, std::nullopt, 1e-6, 4); }), "groups 4 must divide D = 6");
  has(error_of([&] {
        ops::linear_forward(b, x, b.argument({F32, {3, 5}}));
      }),
      "linear_forward: x [..., in] and w [out, in] do not fit: tensor<4x6xf32> and tensor<3x5xf32>");
  has(error_of([&] {
        ops::attention_forward(b, q, k, k, seg, {0.5, 0, 4});
      }),
      "attention_forward: q heads 3 must be a multiple of kv heads 2");
  has(error_of([&] { ops::rope_forward(b, q, ops::rope_tables(b, pos, inv, 1.0)); }),
      "rope_forward: x must be [T, H, 2 * half] for tables tensor<8x3xf32>, got tensor<8x3x4xf32>");
  has(error_of([&] {
        ops::xent_forward(b, x, x, t4, t4, {7, 0, 0, -100});
      }),
      "valid_vocab 7 must be in [1, V_rows = 4]");
  has(error_of([&] { ops::adamw_scalars({}, 0); }), "step must be >= 1");
  const Value q4 = b.argument({F32, {2, 8, 3, 4}});
  has(error_of([&] {
        ops::attention_forward(b, q4, k, k, seg, {0.5, 0, 4});
      }),
      "every tensor needs the batch dimension B = 2, got tensor<8x2x4xf32>");
}

// The LM head with bf16 operands (Operands::kBF16) against float64 on the bf16-rounded h and W: the forward's
// products are exact in f32, so its sums match as closely as the f32 ones (2e-5). The backward rounds the f32
// logit gradient g to bf16 before its two products; the reference rounds its float64 g the same way. Where
// the two g straddle a bf16 rounding boundary one term moves by a bf16 ulp (up to 2^-7 of |g W|, about 4e-3
// of the scale here); on these fixed inputs none does (measured 1e-7), and 1e-3 stays tight enough to catch a
// g that is not rounded at all (about 4e-3).
TEST(XlaOps, Bf16LmHeadCrossEntropyMatchesFloat64OnRoundedOperands) {
  const int64_t N = 20, d = 24, V = 50;
  const double zl = 1e-2;
  const auto h = randu(N * d, -1, 1, 40), w = randu(V * d, -1, 1, 41);
  std::vector<int32_t> tg(N), mask(N, 1);
  std::mt19937 gen(42);
  for (int64_t i = 0; i < N; ++i) tg[i] = int32_t(gen() % V);
  mask[2] = 0;
  const int64_t count = N - 1;
  const float scale = 1.0f / float(count);
  auto rnd = [](float f) { return double(bf16_to_f32(f32_to_bf16(f))); };
  std::vector<double> lse(N, 0), dh(N * d, 0), dw(V * d, 0);
  double ce = 0, z = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (!mask[i]) continue;
    std::vector<double> l(V);
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) {
      l[j] = 0;
      for (int64_t c = 0; c < d; ++c) l[j] += rnd(h[i * d + c]) * rnd(w[j * d + c]);
      mx = std::max(mx, l[j]);
    }
    for (int64_t j = 0; j < V; ++j) s += std::exp(l[j] - mx);
    lse[i] = mx + std::log(s);
    ce += lse[i] - l[tg[i]];
    z += lse[i] * lse[i];
    for (int64_t j = 0; j < V; ++j) {
      const double g = rnd(float(scale * (std::exp(l[j] - lse[i]) * (1 + 2 * zl * lse[i]) - (j == tg[i]))));
      for (int64_t c = 0; c < d; ++c) {
        dh[i * d + c] += g * rnd(w[j * d + c]);
        dw[j * d + c] += g * rnd(h[i * d + c]);
      }
    }
  }
  const std::vector<float> sc{scale};
  ops::XentOptions o{V, zl, 16, -100};
  o.operands = ops::Operands::kBF16;
  auto out = run({arg(h, {N, d}), arg(w, {V, d}), arg(tg, {N}), arg(mask, {N}), arg(sc, {})},
                 [&](HloBuilder& b, const std::vector<Value>& a) {
                   const auto f = ops::xent_forward(b, a[0], a[1], a[2], a[3], o);
                   const auto g = ops::xent_backward(b, a[0], a[1], a[2], a[3], f.lse, a[4], o);
                   return std::vector<Value>{f.ce_sum, f.z_sum, f.lse, g.dh, g.dw};
                 });
  expect_close(out[0].to_host<float>(), std::vector<double>{ce}, 2e-5, "bf16 xent ce_sum vs float64");
  expect_close(out[1].to_host<float>(), std::vector<double>{z}, 2e-5, "bf16 xent z_sum vs float64");
  expect_close(out[2].to_host<float>(), lse, 2e-5, "bf16 xent lse vs float64");
  expect_close(out[3].to_host<float>(), dh, 1e-3, "bf16 xent dh vs float64");
  expect_close(out[4].to_host<float>(), dw, 1e-3, "bf16 xent dW vs float64");
}
