// The KDA mixer emitted as StableHLO (KdaUnit::emit_forward / emit_backward, unit_kda.h) against the same
// unit on the CPU kernels: one linear_attention layer of the hybrid fixture
// (tests/golden/model/olmo3moe_tiny) run alone on a batch of packed documents with padding, its output a, dx
// and every parameter gradient (for a random da) compared with the CPU float path (the chunked delta rule the
// model trains with) and the float64 CPU path. XLA runs the token-by-token recurrence (Emit::delta_chunk 0)
// and the chunked form (chunks of 3, 8, 16, 64: ChunkedMatchesTheRecurrenceAndTheCpuUnit), in f32.
//
// Errors are max |got - want| / max |want| over each tensor (relative to the tensor's scale), printed. Bounds
// (docs/numerics.md "Two fp32 backends"): f32 reductions (the projections, the state's dot products over Dk
// and Dv, the recurrence's sums over tokens, the parameter gradients' sums over tokens) in XLA's order and
// with the recurrence instead of the chunked form: 1e-5 of the scale against either reference (the f32
// rounding of a sum of ~100 terms, a few 1e-7 each, amplified by the gate's exp and the norms' rsqrt); the
// CPU float path itself is 7.3e-7 (a) and 4.4e-7 (dx) from float64 here. Measured (XLA's CPU plugin):
// a 6.1e-7 / 7.1e-7 (against CPU float / float64), dx 5.7e-7 / 4.7e-7, parameter gradients at most 1.5e-6
// / 1.9e-6 (A_log: a sum over every token and key channel; the others <= 1.0e-6): f32 rounding only, 5x under
// the bound. The backward's checkpoint interval does not change the bits (the same steps recomputed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "../xla/xla_test_util.h"
#include "hybrid_test_util.h"
#include "model/decoder_xla.h"
#include "model/unit_block.h"
#include "model/unit_kda.h"
#include "xla/hlo_builder.h"
#include "xla/pjrt.h"

using namespace olmosft;
using namespace olmosft::model;
using namespace olmosft::model::unit;

namespace {

constexpr int64_t kLayer = 1;  // a linear_attention layer (layer 0 is one too, with the dense FFN)
constexpr int64_t kB = 2, kT = 20;

// Row 0: a document of 8 tokens, one of 7, 5 padding. Row 1: a one-token document, one of 13, 2 padding,
// one of 4 (padding between documents).
std::vector<int32_t> segments() {
  std::vector<int32_t> s;
  for (int i = 0; i < 8; ++i) s.push_back(0);
  for (int i = 0; i < 7; ++i) s.push_back(1);
  for (int i = 0; i < 5; ++i) s.push_back(-1);
  s.push_back(3);
  for (int i = 0; i < 13; ++i) s.push_back(4);
  for (int i = 0; i < 2; ++i) s.push_back(-1);
  for (int i = 0; i < 4; ++i) s.push_back(5);
  return s;
}

std::vector<float> randn(size_t n, float sd, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

struct Fixture {
  HfModel hf = load_hf_dir(hybrid_test::fixture_dir());
  const ModelConfig& c = hf.config;
  ParamIndex idx{c};
  KdaUnit u = std::get<KdaUnit>(Block::resolve(idx, c, layer_specs(c)[size_t(kLayer)]).mixer);
  std::vector<int32_t> seg = segments();
  int64_t N = kB * kT, d = c.hidden_size;
  std::vector<int> params() const {
    return {u.q,       u.k,     u.v,     u.o,     u.f1, u.f2, u.bproj, u.A_log,
            u.dt_bias, u.qconv, u.kconv, u.vconv, u.g1, u.g2, u.g2b,   u.onorm};
  }
  std::vector<float> weight(int i) const {
    return hybrid_test::to_vec<float>(hf.at(hf.registry[size_t(i)].name));
  }
};

// The unit on the CPU in value type T: a, dx and the parameter gradients (registry order; empty when absent).
template <typename T>
struct CpuResult {
  std::vector<T> a, dx;
  std::vector<std::vector<T>> g;
};
template <typename T>
CpuResult<T> run_cpu(const Fixture& f, const std::vector<float>& x, const std::vector<float>& da) {
  const size_t P = f.hf.registry.size();
  std::vector<std::vector<T>> w(P), g(P);
  std::vector<const T*> wp(P, nullptr);
  std::vector<T*> gp(P, nullptr);
  for (int i : f.params()) {
    const std::vector<float> v = f.weight(i);
    w[size_t(i)].assign(v.begin(), v.end());
    g[size_t(i)].assign(v.size(), T(0));
    wp[size_t(i)] = w[size_t(i)].data();
    gp[size_t(i)] = g[size_t(i)].data();
  }
  Batch batch;
  batch.B = kB;
  batch.T = kT;
  batch.segments = f.seg.data();
  Ctx<T> ctx{f.c, batch, wp, &gp};
  ctx.N = f.N;
  ctx.d = f.d;
  ctx.seg = f.seg.data();
  Plan p;
  typename KdaUnit::Saved<T> s;
  typename KdaUnit::Scratch<T> sc;
  s.plan(p, f.c, f.N);
  sc.plan(p, f.c, f.N);
  std::vector<std::byte> block(p.bytes() + 64);
  p.carve(reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(block.data()) + 63) & ~uintptr_t(63)));
  const std::vector<T> xt(x.begin(), x.end()), dat(da.begin(), da.end());
  CpuResult<T> r;
  r.a.resize(x.size());
  r.dx.assign(x.size(), T(0));
  f.u.forward(ctx, xt.data(), r.a.data(), s, sc);
  f.u.backward(ctx, xt.data(), s, dat.data(), r.dx.data(), sc);
  r.g = std::move(g);
  return r;
}

// The emitted unit on XLA's CPU plugin: a, then (with DA) dx and the gradients of f.params() in that order.
// CHUNK: the delta rule in chunks of that many tokens (Emit::delta_chunk; 0: the token-by-token recurrence).
std::vector<std::vector<float>> run_xla(const Fixture& f, const std::vector<float>& x,
                                        const std::vector<float>* da, int64_t chunk = 0) {
  xla::HloBuilder b;
  const std::vector<int> ps = f.params();
  std::vector<xla::Value> w(f.hf.registry.size(), b.scalar(xla::ElementType::kF32, 0.0));
  for (int i : ps) w[size_t(i)] = b.argument({xla::ElementType::kF32, f.hf.registry[size_t(i)].shape});
  const xla::Value xv = b.argument({xla::ElementType::kF32, {f.N, f.d}});
  const xla::Value segv = b.argument({xla::ElementType::kS32, {kB, kT}});
  LossConfig loss;
  Emit e(b, f.c, loss, w, kB, kT);
  e.seg = segv;
  e.delta_chunk = chunk;
  if (da != nullptr) e.g.resize(w.size());
  KdaUnit::Emitted s;
  std::vector<xla::Value> out{f.u.emit_forward(e, xv, s)};
  if (da != nullptr) {
    const xla::Value dav = b.argument({xla::ElementType::kF32, {f.N, f.d}});
    out.push_back(f.u.emit_backward(e, xv, s, dav));
    for (int i : ps) out.push_back(*e.g[size_t(i)]);
  }
  b.returns(out);
  xla::Client& c = xla::testutil::test_client(1);
  xla::Executable exe = c.compile(b.module());
  std::vector<std::vector<float>> ws;
  std::vector<xla::Buffer> bufs;
  for (int i : ps) {
    ws.push_back(f.weight(i));
    bufs.push_back(c.to_device(std::span<const float>(ws.back()), f.hf.registry[size_t(i)].shape));
  }
  bufs.push_back(c.to_device(std::span<const float>(x), {f.N, f.d}));
  bufs.push_back(c.to_device(std::span<const int32_t>(f.seg), {kB, kT}));
  if (da != nullptr) bufs.push_back(c.to_device(std::span<const float>(*da), {f.N, f.d}));
  std::vector<xla::Buffer*> ptrs;
  for (xla::Buffer& bb : bufs) ptrs.push_back(&bb);
  std::vector<std::vector<float>> r;
  for (const xla::Buffer& o : exe.execute(ptrs)) r.push_back(o.to_host<float>());
  return r;
}

template <typename W>
double rel_error(const std::vector<float>& got, const std::vector<W>& want) {
  double scale = 1e-30, err = 0;
  for (const W& v : want) scale = std::max(scale, std::fabs(double(v)));
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    err = std::max(err, std::fabs(double(got[i]) - double(want[i])) / scale);
  return err;
}

template <typename W>
void expect_close(const std::vector<float>& got, const std::vector<W>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double e = rel_error(got, want);
  std::cout << what << ": max error " << e << " of the scale (allowed " << tol << ")\n";
  EXPECT_LE(e, tol) << what;
}

}  // namespace

TEST(KdaXla, ForwardMatchesTheCpuUnit) {
  Fixture f;
  const std::vector<float> x = randn(size_t(f.N * f.d), 1.f, 1);
  const std::vector<float> zero(x.size(), 0.f);
  const CpuResult<float> cf = run_cpu<float>(f, x, zero);
  const CpuResult<double> cd = run_cpu<double>(f, x, zero);
  const std::vector<std::vector<float>> xr = run_xla(f, x, nullptr);
  expect_close(xr[0], cf.a, 1e-5, "a vs CPU float");
  expect_close(xr[0], cd.a, 1e-5, "a vs CPU float64");
  // padding tokens: zero output
  for (int64_t t = 0; t < f.N; ++t) {
    if (f.seg[size_t(t)] >= 0) continue;
    for (int64_t j = 0; j < f.d; ++j) EXPECT_EQ(xr[0][size_t(t * f.d + j)], 0.f) << "padding token " << t;
  }
}

// With the backward's checkpoints every 64 tokens (the default: one block of the 20) and every 7 (three
// blocks, the last one padded with no-op tokens).
TEST(KdaXla, BackwardMatchesTheCpuUnit) {
  Fixture f;
  const std::vector<float> x = randn(size_t(f.N * f.d), 1.f, 1), da = randn(x.size(), 1.f, 2);
  const CpuResult<float> cf = run_cpu<float>(f, x, da);
  const CpuResult<double> cd = run_cpu<double>(f, x, da);
  std::cout << "(CPU float vs float64: a " << rel_error(cf.a, cd.a) << ", dx " << rel_error(cf.dx, cd.dx)
            << ")\n";
  std::vector<std::vector<float>> first;
  for (const int64_t ckpt : {int64_t(64), int64_t(7)}) {
    SCOPED_TRACE("checkpoint " + std::to_string(ckpt));
    std::cout << "checkpoint every " << ckpt << " tokens\n";
    f.u.emit_checkpoint = ckpt;
    const std::vector<std::vector<float>> xr = run_xla(f, x, &da);
    if (first.empty()) first = xr;
    EXPECT_TRUE(xr == first) << "the checkpoint interval changed the results' bits";
    expect_close(xr[0], cf.a, 1e-5, "a vs CPU float");
    expect_close(xr[0], cd.a, 1e-5, "a vs CPU float64");
    expect_close(xr[1], cf.dx, 1e-5, "dx vs CPU float");
    expect_close(xr[1], cd.dx, 1e-5, "dx vs CPU float64");
    const std::vector<int> ps = f.params();
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string& name = f.hf.registry[size_t(ps[i])].name;
      expect_close(xr[2 + i], cf.g[size_t(ps[i])], 1e-5, name + " grad vs CPU float");
      expect_close(xr[2 + i], cd.g[size_t(ps[i])], 1e-5, name + " grad vs CPU float64");
    }
  }
}

// The chunked delta rule (Emit::delta_chunk, delta_emit::delta_chunk_forward / _backward) against the
// recurrence on XLA and the CPU unit, chunks of 3 (documents start inside chunks, and the tokens are padded
// to 21), 8 (row 0's second document starts a chunk; row 1's start inside), 16 and 64 (one chunk padded
// from 20 tokens). Against the recurrence the two forms differ by their f32 sums' order only (the chunk's
// cumulative decays, the WY solve): a and dx within 2e-6 of the scale (measured at most 2.6e-7), the
// parameter gradients within 5e-6 (measured at most 1.5e-6: A_log, a sum over every token and key channel;
// the others <= 4.6e-7); against the CPU references the same 1e-5 as the recurrence (measured <= 2.2e-6).
TEST(KdaXla, ChunkedMatchesTheRecurrenceAndTheCpuUnit) {
  Fixture f;
  const std::vector<float> x = randn(size_t(f.N * f.d), 1.f, 1), da = randn(x.size(), 1.f, 2);
  const CpuResult<float> cf = run_cpu<float>(f, x, da);
  const CpuResult<double> cd = run_cpu<double>(f, x, da);
  const std::vector<std::vector<float>> rec = run_xla(f, x, &da, 0);
  const std::vector<int> ps = f.params();
  for (const int64_t chunk : {int64_t(3), int64_t(8), int64_t(16), int64_t(64)}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    std::cout << "chunks of " << chunk << " tokens\n";
    const std::vector<std::vector<float>> xr = run_xla(f, x, &da, chunk);
    ASSERT_EQ(xr.size(), rec.size());
    expect_close(xr[0], rec[0], 2e-6, "a vs the recurrence");
    expect_close(xr[1], rec[1], 2e-6, "dx vs the recurrence");
    expect_close(xr[0], cd.a, 1e-5, "a vs CPU float64");
    expect_close(xr[1], cf.dx, 1e-5, "dx vs CPU float");
    expect_close(xr[1], cd.dx, 1e-5, "dx vs CPU float64");
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string& name = f.hf.registry[size_t(ps[i])].name;
      expect_close(xr[2 + i], rec[2 + i], 5e-6, name + " grad vs the recurrence");
      expect_close(xr[2 + i], cd.g[size_t(ps[i])], 1e-5, name + " grad vs CPU float64");
    }
    for (int64_t t = 0; t < f.N; ++t) {  // padding tokens: zero output
      if (f.seg[size_t(t)] >= 0) continue;
      for (int64_t j = 0; j < f.d; ++j) EXPECT_EQ(xr[0][size_t(t * f.d + j)], 0.f) << "padding token " << t;
    }
  }
}

// A document boundary restarts the conv window and the delta rule's state: changing the first document's x
// leaves the outputs (and dx) of every other token bit-identical, and changes the first document's.
TEST(KdaXla, DocumentBoundaryResetsTheState) {
  Fixture f;
  const std::vector<float> x = randn(size_t(f.N * f.d), 1.f, 1), da = randn(x.size(), 1.f, 2);
  std::vector<float> x2 = x;
  const std::vector<float> noise = randn(size_t(8 * f.d), 1.f, 3);
  for (size_t i = 0; i < noise.size(); ++i) x2[i] += noise[i];  // row 0, tokens 0-7: document 0
  for (const int64_t chunk : {int64_t(0), int64_t(16)}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const std::vector<std::vector<float>> r1 = run_xla(f, x, &da, chunk), r2 = run_xla(f, x2, &da, chunk);
    int64_t changed = 0;
    for (int64_t t = 0; t < f.N; ++t)
      for (int64_t j = 0; j < f.d; ++j) {
        const size_t i = size_t(t * f.d + j);
        if (t < 8) {
          changed += r1[0][i] != r2[0][i];
          continue;
        }
        EXPECT_EQ(r1[0][i], r2[0][i]) << "a, token " << t;
        EXPECT_EQ(r1[1][i], r2[1][i]) << "dx, token " << t;
      }
    EXPECT_GT(changed, 7 * f.d) << "document 0's outputs did not change";
  }
}

// Through the whole decoder: Block dispatches a mixer with an `Emitted` type to its emit_* (EmitsXla,
// unit_block.h), so a hybrid of KDA layers with dense FFNs runs on XLA with nothing else changed. The fixture
// cut to its layer 0 (KDA + the dense SwiGLU; the whole fixture is in decoder_xla_test) on the fixture batch
// (128 tokens): the CE sum and every gradient against the CPU backend, bound 1e-5 (docs/numerics.md "Two
// fp32 backends"). Measured: CE 2.0e-8 relative, gradients at most 5.6e-6 of the scale (q_proj; embed_tokens
// 3.3e-6, the rest <= 3.4e-6). The CPU's chunked and recurrent forms are <= 2.4e-6 apart (printed) and XLA
// is as far from either: the gap is XLA's own f32 exp / log / logistic (1e-6 relative, docs/xla.md) over the
// gate, the convs' SiLU and the norms on 128 tokens, not the delta rule's algorithm.
TEST(KdaXla, OneLayerHybridDecoderMatchesTheCpuBackend) {
  HfModel hf = load_hf_dir(hybrid_test::fixture_dir());
  ModelConfig c = hf.config;
  c.num_hidden_layers = 1;
  c.layer_types.resize(1);
  const hybrid_test::FixtureBatch fb = hybrid_test::load_batch();
  const Batch b = fb.batch();
  XlaDecoder x(c, XlaOptions{});
  DecoderOptions rec;
  rec.kda_recurrent = true;
  Decoder cpu(c, DecoderOptions{}), cpu_rec(c, rec);
  for (auto& p : cpu_rec.params()) p.value.copy_from(hf.at(p.name));
  cpu_rec.forward_backward(b, LossConfig{}, 1.0 / 100, 1.0);
  for (auto& p : x.params()) p.value.copy_from(hf.at(p.name));
  for (auto& p : cpu.params()) p.value.copy_from(hf.at(p.name));
  const LossParts px = x.forward_backward(b, LossConfig{}, 1.0 / 100, 1.0);
  const LossParts pc = cpu.forward_backward(b, LossConfig{}, 1.0 / 100, 1.0);
  const double ce = std::fabs(px.sum[kLossCe] - pc.sum[kLossCe]) / std::fabs(pc.sum[kLossCe]);
  std::cout << "CE sum: relative difference " << ce << "\n";
  EXPECT_LT(ce, 1e-5);
  ASSERT_EQ(x.params().size(), cpu.params().size());
  for (size_t i = 0; i < x.params().size(); ++i) {
    const Tensor &gx = x.params()[i].grad, &gc = cpu.params()[i].grad;
    const std::vector<float> vx(gx.data<float>(), gx.data<float>() + gx.numel()),
        vc(gc.data<float>(), gc.data<float>() + gc.numel());
    expect_close(vx, vc, 1e-5, x.params()[i].name + " grad vs the CPU backend");
    const Tensor& gr = cpu_rec.params()[i].grad;
    std::cout << "  (vs the CPU recurrent form "
              << rel_error(vx, std::vector<float>(gr.data<float>(), gr.data<float>() + gr.numel()))
              << "; CPU chunked vs recurrent "
              << rel_error(vc, std::vector<float>(gr.data<float>(), gr.data<float>() + gr.numel())) << ")\n";
  }
}
