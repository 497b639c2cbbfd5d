// float64 central finite differences for every input of every KDA kernel (conv + SiLU, L2 norm, gate, beta,
// the recurrent and chunked delta rule, the gated output norm). Loss = sum(output * R) for a fixed random R;
// the analytic gradient comes from the backward kernel. Central differences with h = 1e-6 have truncation
// error ~1e-12 and rounding error ~1e-10 at these magnitudes, so 1e-7 relative (to the largest gradient
// entry) separates correct gradients from any real bug by orders of magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "core/threads.h"
#include "kda_test_util.h"
#include "kernels/kda.h"

using namespace olmosft::kda;
using kdatest::dot;
using kdatest::fd_check;
using kdatest::randn;
using V = std::vector<double>;

namespace {
constexpr double kTol = 1e-7;

// The finite-difference loops call the kernels thousands of times on tiny inputs; on a loaded machine each
// OpenMP fork/join costs milliseconds, so these tests run single-threaded (threading is exercised elsewhere).
class KdaGrad : public ::testing::Test {
 protected:
  void SetUp() override { olmosft::set_threads(1); }
  void TearDown() override { olmosft::set_threads(0); }
};

// The inputs of a delta-rule check: documents [0, ends[0]), [ends[0], ends[1]), ... then padding; q, k (scale
// 0.5), v, R normal, g uniform in [g_lo, g_hi], beta uniform in (0.05, 1.95), from seeds seed .. seed + 5.
struct DeltaRuleInputs {
  KdaDims d;
  std::vector<int32_t> seg;
  V q, k, v, g, beta, R;
  DeltaRuleInputs(KdaDims dims, const std::vector<int64_t>& ends, uint64_t seed, double g_lo, double g_hi)
      : d(dims), seg(size_t(dims.L), -1) {
    int64_t t = 0;
    for (size_t doc = 0; doc < ends.size(); ++doc)
      for (; t < ends[doc]; ++t) seg[size_t(t)] = int32_t(doc);
    const size_t NH = size_t(d.L * d.H);
    q = randn<double>(NH * d.K, seed, 0.5);
    k = randn<double>(NH * d.K, seed + 1, 0.5);
    v = randn<double>(NH * d.V, seed + 2);
    g = kdatest::uniform<double>(NH * d.K, seed + 3, g_lo, g_hi);
    beta = kdatest::uniform<double>(NH, seed + 4, 0.05, 1.95);
    R = randn<double>(NH * d.V, seed + 5);
  }
  size_t out_size() const { return size_t(d.L * d.H * d.V); }
};

// The analytic gradients of loss() = sum(output * R) w.r.t. q, k, v, g, beta against finite differences.
void expect_delta_rule_grads(const std::string& label, DeltaRuleInputs& in,
                             const std::function<double()>& loss, const V& dq, const V& dk, const V& dv,
                             const V& dg, const V& db) {
  const double eq = fd_check(in.q, loss, dq), ek = fd_check(in.k, loss, dk), ev = fd_check(in.v, loss, dv),
               eg = fd_check(in.g, loss, dg), eb = fd_check(in.beta, loss, db);
  std::printf("%s: dq %.2e dk %.2e dv %.2e dg %.2e dbeta %.2e\n", label.c_str(), eq, ek, ev, eg, eb);
  EXPECT_LE(eq, kTol) << label;
  EXPECT_LE(ek, kTol) << label;
  EXPECT_LE(ev, kTol) << label;
  EXPECT_LE(eg, kTol) << label;
  EXPECT_LE(eb, kTol) << label;
}
}  // namespace

TEST_F(KdaGrad, ShortConvSilu) {
  const int64_t B = 2, L = 12, C = 5, K = 4;
  // Row 0: a 2-token document (shorter than the kernel), a 7-token one, 3 padding; row 1: 12 tokens.
  std::vector<int32_t> seg = {0, 0, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3};
  V x = randn<double>(B * L * C, 1), w = randn<double>(C * K, 2, 0.5), R = randn<double>(B * L * C, 3);
  auto loss = [&] {
    V y(x.size());
    short_conv_silu_forward(x.data(), w.data(), seg.data(), B, L, C, K, y.data());
    return dot(y, R);
  };
  V dx(x.size()), dw(w.size(), 0.0);
  short_conv_silu_backward(x.data(), w.data(), seg.data(), B, L, C, K, R.data(), dx.data(), dw.data());
  const double ex = fd_check(x, loss, dx), ew = fd_check(w, loss, dw);
  std::printf("conv: dx %.2e dw %.2e\n", ex, ew);
  EXPECT_LE(ex, kTol);
  EXPECT_LE(ew, kTol);
  // Parameter gradients accumulate.
  V dw2 = dw;
  short_conv_silu_backward(x.data(), w.data(), seg.data(), B, L, C, K, R.data(), dx.data(), dw2.data());
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-12);
}

TEST_F(KdaGrad, L2Norm) {
  const int64_t N = 6, D = 7;
  V x = randn<double>(N * D, 4), R = randn<double>(N * D, 5);
  x[3] = 1e-4;  // harmless; rows stay well away from the eps regime except...
  for (int64_t i = 0; i < D; ++i) x[5 * D + i] *= 1e-3;  // ...this one, where eps matters
  auto loss = [&] {
    V y(x.size());
    l2norm_forward(x.data(), N, D, kL2NormEps, y.data());
    return dot(y, R);
  };
  V dx(x.size());
  l2norm_backward(x.data(), R.data(), N, D, kL2NormEps, dx.data());
  const double e = fd_check(x, loss, dx, 1e-8);
  std::printf("l2norm: dx %.2e\n", e);
  EXPECT_LE(e, 1e-6);
}

TEST_F(KdaGrad, Gate) {
  const int64_t N = 5, H = 2, K = 3;
  V f = randn<double>(N * H * K, 6, 2.0), A_log = {std::log(1.5), std::log(12.0)},
    dtb = randn<double>(H * K, 7);
  V R = randn<double>(N * H * K, 8);
  auto loss = [&] {
    V g(f.size());
    kda_gate_forward(f.data(), A_log.data(), dtb.data(), N, H, K, g.data());
    return dot(g, R);
  };
  V df(f.size()), dA(H, 0.0), ddt(H * K, 0.0);
  kda_gate_backward(f.data(), A_log.data(), dtb.data(), R.data(), N, H, K, df.data(), dA.data(), ddt.data());
  const double ef = fd_check(f, loss, df), ea = fd_check(A_log, loss, dA), eb = fd_check(dtb, loss, ddt);
  std::printf("gate: df %.2e dA_log %.2e ddt_bias %.2e\n", ef, ea, eb);
  EXPECT_LE(ef, kTol);
  EXPECT_LE(ea, kTol);
  EXPECT_LE(eb, kTol);
  V g(f.size());
  kda_gate_forward(f.data(), A_log.data(), dtb.data(), N, H, K, g.data());
  for (double x : g) EXPECT_LE(x, 0.0);
}

TEST_F(KdaGrad, Beta) {
  for (bool neg : {true, false}) {
    V b = randn<double>(9, 9, 2.0), R = randn<double>(9, 10);
    auto loss = [&] {
      V y(b.size());
      kda_beta_forward(b.data(), int64_t(b.size()), neg, y.data());
      for (double x : y) EXPECT_TRUE(x > 0 && x < (neg ? 2.0 : 1.0));
      return dot(y, R);
    };
    V db(b.size());
    kda_beta_backward(b.data(), R.data(), int64_t(b.size()), neg, db.data());
    const double e = fd_check(b, loss, db);
    std::printf("beta (neg_eigval=%d): db %.2e\n", int(neg), e);
    EXPECT_LE(e, kTol);
  }
}

TEST_F(KdaGrad, OutputNorm) {
  const int64_t N = 6, D = 8;
  V o = randn<double>(N * D, 11), z = randn<double>(N * D, 12), w = randn<double>(D, 13, 0.3, 1.0);
  V R = randn<double>(N * D, 14);
  const double eps = 1e-5;
  auto loss = [&] {
    V y(o.size());
    kda_output_norm_forward(o.data(), z.data(), w.data(), N, D, eps, y.data());
    return dot(y, R);
  };
  V dout(o.size()), dz(z.size()), dw(D, 0.0);
  kda_output_norm_backward(o.data(), z.data(), w.data(), R.data(), N, D, eps, dout.data(), dz.data(),
                           dw.data());
  const double eo = fd_check(o, loss, dout), ez = fd_check(z, loss, dz), ew = fd_check(w, loss, dw);
  std::printf("output norm: do %.2e dz %.2e dw %.2e\n", eo, ez, ew);
  EXPECT_LE(eo, kTol);
  EXPECT_LE(ez, kTol);
  EXPECT_LE(ew, kTol);
}

// The delta rule, both implementations, w.r.t. q, k, v, g, beta. Inputs are NOT normalised here (the kernel
// must be right for any input), two documents with the boundary mid-chunk, padding at the end, beta in (0,2).
TEST_F(KdaGrad, DeltaRule) {
  DeltaRuleInputs in({1, 21, 2, 4, 3}, {11, 19}, 21, -1.5, -0.01);
  const double scale = 0.5;
  for (bool chunked : {false, true}) {
    auto loss = [&] {
      V o(in.out_size());
      if (chunked)
        kda_chunk_forward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.seg.data(),
                          in.d, scale, o.data(), 8);
      else
        kda_recurrent_forward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                              in.seg.data(), in.d, scale, o.data());
      return dot(o, in.R);
    };
    V dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), dg(in.g.size()), db(in.beta.size());
    if (chunked)
      kda_chunk_backward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.seg.data(),
                         in.d, scale, in.R.data(), dq.data(), dk.data(), dv.data(), dg.data(), db.data(), 8);
    else
      kda_recurrent_backward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                             in.seg.data(), in.d, scale, in.R.data(), dq.data(), dk.data(), dv.data(),
                             dg.data(), db.data(), 5);
    expect_delta_rule_grads(chunked ? "chunked" : "recurrent", in, loss, dq, dk, dv, dg, db);
  }
}

// The chunked delta rule with chunks longer than its 16-token sub-chunks (kernels/kda_chunk.cpp: pairs across
// sub-chunks go through factored decays and GEMMs, forward and backward): chunks of 32 and 64, a 41-token
// document (sub-chunks of 16, 16, 9 at chunk 64; a boundary inside the second chunk at 32), a 12-token one,
// padding. Strong and weak decays per channel.
TEST_F(KdaGrad, DeltaRuleAcrossSubChunks) {
  DeltaRuleInputs in({1, 56, 2, 4, 3}, {41, 53}, 31, -0.4, -0.005);
  for (size_t i = 0; i < in.g.size(); i += 5) in.g[i] *= 8;  // some channels forget fast
  const double scale = 0.5;
  for (int64_t chunk : {32, 64})
    for (bool saved_vn : {false, true}) {  // the backward recomputing Vn, or given the forward's
      auto forward = [&](double* o, double* vn) {
        kda_chunk_forward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.seg.data(),
                          in.d, scale, o, chunk, vn);
      };
      auto loss = [&] {
        V o(in.out_size());
        forward(o.data(), nullptr);
        return dot(o, in.R);
      };
      V o(in.out_size()), vn(in.out_size());
      double* vnp = saved_vn ? vn.data() : nullptr;
      forward(o.data(), vnp);
      V dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), dg(in.g.size()), db(in.beta.size());
      kda_chunk_backward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.seg.data(),
                         in.d, scale, in.R.data(), dq.data(), dk.data(), dv.data(), dg.data(), db.data(),
                         chunk, vnp);
      expect_delta_rule_grads("chunk " + std::to_string(chunk) + (saved_vn ? " saved vn" : ""), in, loss, dq,
                              dk, dv, dg, db);
    }
}

// Conv windows never cross documents: a packed row (documents of 2, 9, 1 tokens, then padding) equals each
// document convolved alone, forward and backward (dw summed over documents).
TEST_F(KdaGrad, ShortConvPackedEqualsSeparate) {
  const int64_t L = 15, C = 6, K = 4;
  const std::vector<int32_t> seg = {4, 4, 7, 7, 7, 7, 7, 7, 7, 7, 7, 9, -1, -1, -1};
  const int64_t bounds[] = {0, 2, 11, 12};
  V x = randn<double>(L * C, 31), w = randn<double>(C * K, 32), dy = randn<double>(L * C, 33);
  V y(L * C), dx(L * C), dw(C * K, 0.0);
  short_conv_silu_forward(x.data(), w.data(), seg.data(), 1, L, C, K, y.data());
  short_conv_silu_backward(x.data(), w.data(), seg.data(), 1, L, C, K, dy.data(), dx.data(), dw.data());
  V dw_sum(C * K, 0.0);
  for (int doc = 0; doc < 3; ++doc) {
    const int64_t t0 = bounds[doc], n = bounds[doc + 1] - t0;
    V xs(x.begin() + t0 * C, x.begin() + (t0 + n) * C), dys(dy.begin() + t0 * C, dy.begin() + (t0 + n) * C);
    V ys(n * C), dxs(n * C);
    short_conv_silu_forward(xs.data(), w.data(), nullptr, 1, n, C, K, ys.data());
    short_conv_silu_backward(xs.data(), w.data(), nullptr, 1, n, C, K, dys.data(), dxs.data(), dw_sum.data());
    for (int64_t i = 0; i < n * C; ++i) {
      EXPECT_EQ(y[t0 * C + i], ys[i]) << "doc " << doc;
      EXPECT_EQ(dx[t0 * C + i], dxs[i]) << "doc " << doc;
    }
  }
  for (int64_t i = 12 * C; i < L * C; ++i) {
    EXPECT_EQ(y[i], 0.0);
    EXPECT_EQ(dx[i], 0.0);
  }
  for (int64_t i = 0; i < C * K; ++i) EXPECT_NEAR(dw[i], dw_sum[i], 1e-13);
}

// The output-norm gain gradient accumulates into a non-zero buffer (gradient accumulation over
// micro-batches): its bits must not depend on the thread count or on thread timing. The kernel used to add
// per-thread partials under a mutex in arrival order, which made 2-thread hybrid training runs differ from
// run to run (found by tests/e2e/train_hybrid.sh). float32, N large enough for several row blocks.
TEST(KdaOutputNorm, GainGradientBitsIndependentOfThreads) {
  const int64_t N = 4096, D = 32;
  auto f32 = [](const V& v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> o = f32(randn<double>(N * D, 21)), z = f32(randn<double>(N * D, 22)),
                           w = f32(randn<double>(D, 23, 0.3, 1.0)), dy = f32(randn<double>(N * D, 24));
  const std::vector<float> dw0 = f32(randn<double>(D, 25));  // gradient of an earlier micro-batch
  auto run = [&](int threads) {
    olmosft::set_threads(threads);
    std::vector<float> dout(o.size()), dz(z.size()), dw = dw0;
    kda_output_norm_backward(o.data(), z.data(), w.data(), dy.data(), N, D, 1e-5f, dout.data(), dz.data(),
                             dw.data());
    return dw;
  };
  const std::vector<float> ref = run(1);
  for (int rep = 0; rep < 8; ++rep) {
    const std::vector<float> got = run(2 + rep % 3);
    for (int64_t i = 0; i < D; ++i)
      ASSERT_EQ(got[size_t(i)], ref[size_t(i)]) << "gain " << i << " rep " << rep;
  }
  olmosft::set_threads(0);
}
