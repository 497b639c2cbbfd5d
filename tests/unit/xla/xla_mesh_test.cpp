// The device mesh (xla/mesh.h) and the SPMD ops of the builder (hlo_builder_spmd.cpp) on XLA's CPU plugin's
// devices: mesh shardings, manual regions with all_gather / reduce_scatter / all_reduce and the device index,
// and the blockwise attention over a mesh (context parallelism: a row's tokens split over devices) against
// the one-device program and the naive float64 reference, on rows whose documents cross every piece's
// boundary, with padding and windows shorter than a piece.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>

#include "../kernels/attn_util.h"
#include "xla/hlo_builder.h"
#include "xla/mesh.h"
#include "xla/ops_attention.h"
#include "xla/pjrt.h"
#include "xla_test_util.h"

using namespace olmosft;
using namespace olmosft::xla;

namespace {

constexpr ElementType F32 = ElementType::kF32;
constexpr ElementType S32 = ElementType::kS32;

Client& cpu() { return testutil::test_client(8); }

// A program over MESH: each argument and result split along dimension 0 over every device (row tiles /
// tokens) or replicated; runs it with each device's part of the host arrays and joins the parts.
struct SpmdArg {
  std::vector<float> f;
  std::vector<int32_t> s;
  TensorType type;
  bool split = true;
};
std::vector<std::vector<float>> run_spmd(
    const Mesh& mesh, const std::vector<SpmdArg>& args,
    const std::function<std::vector<Value>(HloBuilder&, const std::vector<Value>&)>& body) {
  const int64_t D = mesh.devices();
  auto layout = [&](const TensorType& t, bool split) {
    std::vector<Logical> axes(t.dims.size(), Logical::kNone);
    if (split) axes[0] = Logical::kRowTiles;
    return mesh_sharding(mesh, t.dims, axes, "test");
  };
  HloBuilder b("spmd_test");
  b.partitions(D);
  std::vector<Value> in;
  for (const SpmdArg& a : args) {
    in.push_back(b.argument(a.type));
    b.shard_argument(in.back(), layout(a.type, a.split));
  }
  const std::vector<Value> out = body(b, in);
  b.returns(out);
  for (size_t i = 0; i < out.size(); ++i) b.shard_result(i, layout(out[i].type(), true));
  CompileOptions co;
  co.num_partitions = D;
  co.use_spmd_partitioning = true;
  Client& c = cpu();
  Executable exe = c.compile(b.module(), co);
  std::vector<std::vector<Buffer>> bufs(static_cast<size_t>(D));
  std::vector<std::vector<Buffer*>> ptrs(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    for (const SpmdArg& a : args) {
      TensorType t = a.type;
      const int64_t n = t.elements() / (a.split ? D : 1);
      const int64_t at = a.split ? d * n : 0;
      if (a.split) t.dims[0] /= D;
      if (t.type == F32)
        bufs[size_t(d)].push_back(
            c.to_device(std::span<const float>(a.f.data() + at, size_t(n)), t.dims, size_t(d)));
      else
        bufs[size_t(d)].push_back(
            c.to_device(std::span<const int32_t>(a.s.data() + at, size_t(n)), t.dims, size_t(d)));
    }
    for (Buffer& x : bufs[size_t(d)]) ptrs[size_t(d)].push_back(&x);
  }
  const auto res = exe.execute_partitioned(ptrs);
  std::vector<std::vector<float>> joined(out.size());
  for (size_t i = 0; i < out.size(); ++i)
    for (int64_t d = 0; d < D; ++d) {
      const auto part = res[size_t(d)][i].type().type == F32 ? res[size_t(d)][i].to_host<float>() : [&] {
        const auto v = res[size_t(d)][i].to_host<int32_t>();
        return std::vector<float>(v.begin(), v.end());
      }();
      joined[i].insert(joined[i].end(), part.begin(), part.end());
    }
  return joined;
}

}  // namespace

TEST(XlaMesh, ShardingsFollowTheRulesTable) {
  const Mesh m{.data = 2, .fsdp = 2, .expert = 1, .context = 2};
  EXPECT_EQ(m.devices(), 8);
  EXPECT_EQ(m.text(), "data=2 fsdp=2 expert=1 context=2");
  // tokens over every axis, in device order
  EXPECT_EQ(mesh_sharding(m, {16}, {Logical::kTokens}, "x"), "{devices=[8]0,1,2,3,4,5,6,7}");
  // a parameter over fsdp x context, replicated over data: devices d and d + 4 hold the same part
  EXPECT_EQ(param_sharding(m, {8, 6}), "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}");
  EXPECT_EQ(param_split_dim(m, {6, 8}), 1);  // the first dimension the 4 shards divide
  EXPECT_EQ(param_split_dim(m, {6, 3}), -1);
  EXPECT_EQ(param_sharding(m, {6, 3}), "{replicated}");
  EXPECT_EQ(param_part(m, 5), 1);
  EXPECT_NE(testutil::error_of([&] {
              mesh_sharding(m, {12}, {Logical::kTokens}, "tokens");
            }).find("mesh: tokens: dimension 0 (12) does not split evenly over 8 devices"),
            std::string::npos);
  // the blocked token order: device 5 = (data 1, fsdp 0, context 1) of a [4, 8] batch holds rows 2..2,
  // tokens 4..7
  EXPECT_EQ(tile_row0(m, 5, 4), 2);
  EXPECT_EQ(tile_col0(m, 5, 8), 4);
  EXPECT_EQ(sequence_groups(m), (HloBuilder::DeviceGroups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
}

// Inside a manual region over data 2 x context 2: the device index, a gather along the row, the sum
// scattered back and the group sum, each against its definition.
TEST(XlaMesh, ManualRegionCollectivesOverSequenceGroups) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  const Mesh m{.data = 2, .context = 2};
  const int64_t D = 4;
  SpmdArg x;
  x.type = {F32, {8, 3}};
  for (int i = 0; i < 24; ++i) x.f.push_back(float(i) * 0.5f - 3.0f);
  const auto sh = [&](const std::vector<int64_t>& dims) {
    std::vector<Logical> axes(dims.size(), Logical::kNone);
    axes[0] = Logical::kRowTiles;
    return mesh_sharding(m, dims, axes, "x");
  };
  const auto out = run_spmd(m, {x}, [&](HloBuilder& b, const std::vector<Value>& a) {
    const Value l = b.full_to_shard(a[0], sh({8, 3}), {F32, {2, 3}});
    const auto groups = sequence_groups(m);
    const Value g = b.all_gather(l, 0, groups);  // [4, 3]: the group's two tiles
    const Value rs = b.reduce_scatter(g, 0, groups);
    const Value ar = b.all_reduce_sum(l, groups);
    const Value idx = b.full_to_shard(b.iota({S32, {D}}, 0), sh({D}), {S32, {1}});
    const auto fenced = b.optimization_barrier({rs, ar});
    return std::vector<Value>{b.shard_to_full(g, sh({16, 3}), {F32, {16, 3}}),
                              b.shard_to_full(fenced[0], sh({8, 3}), {F32, {8, 3}}),
                              b.shard_to_full(fenced[1], sh({8, 3}), {F32, {8, 3}}),
                              b.shard_to_full(b.convert(idx, F32), sh({D}), {F32, {D}})};
  });
  for (int64_t d = 0; d < D; ++d) {
    const int64_t group = d / 2;
    for (int64_t i = 0; i < 12; ++i)  // device d's gather: its group's rows 4 group .. 4 group + 3
      EXPECT_EQ(out[0][size_t(d * 12 + i)], x.f[size_t(group * 12 + i)]) << "gather, device " << d;
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(out[1][size_t(d * 6 + i)], 2 * x.f[size_t(d * 6 + i)]) << "reduce_scatter, device " << d;
      EXPECT_EQ(out[2][size_t(d * 6 + i)], x.f[size_t(group * 12 + i)] + x.f[size_t(group * 12 + 6 + i)])
          << "all_reduce, device " << d;
    }
    EXPECT_EQ(out[3][size_t(d)], float(d)) << "device index";
  }
}

namespace {

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

AttentionConfig attention_config(int64_t batch, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t Dv,
                                 int64_t window, double scale) {
  AttentionConfig c;
  c.batch = batch, c.seq = T, c.heads = H, c.kv_heads = Hkv, c.head_dim = D, c.v_head_dim = Dv;
  c.window = window, c.scale = scale;
  return c;
}

// Blockwise attention of B rows of T tokens over MESH against the naive float64 reference and the one-device
// program: the host lays q, k, v, seg and dout out as row tiles in the mesh's blocked order and joins the
// results back (returns the largest error over out, lse, dq, dk, dv relative to each tensor's scale).
double mesh_attention_error(const Mesh& m, int64_t window, const std::vector<int32_t>& seg, int64_t B,
                            int64_t T) {
  const int64_t H = 4, Hkv = 2, Dh = 8, C = m.seq_shards(), R = m.batch_shards(), Tl = T / C, Bl = B / R;
  const auto q = attn_test::cast<float>(attn_test::randn(size_t(B * T * H * Dh), 15)),
             k = attn_test::cast<float>(attn_test::randn(size_t(B * T * Hkv * Dh), 16)),
             v = attn_test::cast<float>(attn_test::randn(size_t(B * T * Hkv * Dh), 17)),
             dout = attn_test::cast<float>(attn_test::randn(size_t(B * T * H * Dh), 18));
  const AttentionConfig c = attention_config(B, T, H, Hkv, Dh, Dh, window, 1.0 / std::sqrt(double(Dh)));
  const auto ref = attn_test::naive(c, to_double(q), to_double(k), to_double(v), seg, to_double(dout));
  // token (row r, position t) of the blocked order: device d = (r / Bl) * C + t / Tl, then its tile row-major
  auto blocked = [&](int64_t r, int64_t t) {
    const int64_t d = (r / Bl) * C + t / Tl;
    return (d * Bl + r % Bl) * Tl + t % Tl;
  };
  auto tiles = [&](const auto& x, int64_t width) {
    std::remove_cvref_t<decltype(x)> y(x.size());
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(x.begin() + (r * T + t) * width, width, y.begin() + blocked(r, t) * width);
    return y;
  };
  SpmdArg aq{tiles(q, H * Dh), {}, {F32, {B * C, Tl, H, Dh}}},
      ak{tiles(k, Hkv * Dh), {}, {F32, {B * C, Tl, Hkv, Dh}}},
      av{tiles(v, Hkv * Dh), {}, {F32, {B * C, Tl, Hkv, Dh}}},
      ad{tiles(dout, H * Dh), {}, {F32, {B * C, Tl, H, Dh}}};
  SpmdArg as{{}, tiles(seg, 1), {S32, {B * C, Tl}}};
  ops::AttentionOptions o{c.scale, window, 4};
  o.mesh = &m;
  const auto out = run_spmd(m, {aq, ak, av, as, ad}, [&](HloBuilder& b, const std::vector<Value>& a) {
    const auto f = ops::attention_forward(b, a[0], a[1], a[2], a[3], o);
    const auto g = ops::attention_backward(b, a[0], a[1], a[2], a[3], f.out, f.lse, a[4], o);
    return std::vector<Value>{f.out, f.lse, g.dq, g.dk, g.dv};
  });
  // back to [B, T, ...] (lse: [B * C, H, Tl] tiles -> [B, H, T])
  auto untile = [&](const std::vector<float>& y, int64_t width) {
    std::vector<float> x(y.size());
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(y.begin() + blocked(r, t) * width, width, x.begin() + (r * T + t) * width);
    return x;
  };
  std::vector<float> lse(size_t(B * H * T));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t bt = blocked(r, t) / Tl;  // its tile row
        lse[size_t((r * H + h) * T + t)] = out[1][size_t((bt * H + h) * Tl + t % Tl)];
      }
  const std::vector<std::vector<float>> got{untile(out[0], H * Dh), lse, untile(out[2], H * Dh),
                                            untile(out[3], Hkv * Dh), untile(out[4], Hkv * Dh)};
  const std::vector<double>* want[] = {&ref.o, &ref.lse, &ref.dq, &ref.dk, &ref.dv};
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double scale = 1e-30, err = 0;
    for (double w : *want[i])
      if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
    for (size_t j = 0; j < got[i].size(); ++j) {
      const double w = (*want[i])[j];
      if (!std::isfinite(w)) {
        EXPECT_EQ(double(got[i][j]), w) << "tensor " << i << " at " << j;
        continue;
      }
      err = std::max(err, std::fabs(double(got[i][j]) - w) / scale);
    }
    worst = std::max(worst, err);
  }
  return worst;
}

}  // namespace

// Context parallelism: 2 rows of 48 tokens, documents crossing every piece boundary (lengths 7, 13, 19, 5
// and padding; 30 and 18), windows 0 and 5 (shorter than the pieces of 6 over 8 devices), over context 2, 4,
// 8 and meshes data 2 x context 2, fsdp 2 x context 4: out, lse, dq, dk, dv within 2e-5 of the scale of the
// float64 reference (the one-device bound of XlaOps.BatchedAttention*).
TEST(XlaMesh, ContextParallelAttentionMatchesFloat64) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  const int64_t B = 2, T = 48;
  std::vector<int32_t> seg = attn_test::segments({7, 13, 19, 5, -4});
  const auto row1 = attn_test::segments({30, 18});
  seg.insert(seg.end(), row1.begin(), row1.end());
  ASSERT_EQ(int64_t(seg.size()), B * T);
  const Mesh meshes[] = {
      {.context = 2}, {.context = 4}, {.context = 8}, {.data = 2, .context = 2}, {.fsdp = 2, .context = 4},
      {.fsdp = 2}};
  for (const Mesh& m : meshes)
    for (int64_t window : {0, 5}) {
      const double e = mesh_attention_error(m, window, seg, B, T);
      std::printf("attention over mesh %s, window %lld: %.3g of scale vs float64\n", m.text().c_str(),
                  (long long)window, e);
      EXPECT_LT(e, 2e-5) << m.text() << " window " << window;
    }
}
