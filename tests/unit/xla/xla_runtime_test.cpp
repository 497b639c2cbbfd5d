// The PJRT runtime on XLA's CPU plugin (installed by scripts/install-deps.sh, so never skipped): plugin
// loading and its errors (missing path, not a plugin, a different API major refused, a newer minor accepted),
// client and devices, exact host <-> device round trips (f32, bf16, f64, s32, pred), the CompileOptionsProto
// bytes, execution with and without donation, and PJRT errors carried into olmosft::Error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "core/error.h"
#include "xla/hlo_builder.h"
#include "xla/pjrt.h"
#include "xla_test_util.h"

using namespace olmosft;
using namespace olmosft::xla;

namespace {

Client& cpu() { return testutil::test_client(2); }
using testutil::error_of;

// A temporary directory of this test, removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "olmosft_xla_runtime_XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

const char* kAddModule = R"(module @add {
  func.func public @main(%arg0: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %arg1: tensor<4xf32>) -> (tensor<4xf32>) {
    %0 = "stablehlo.add"(%arg0, %arg1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%0) : (tensor<4xf32>) -> ()
  }
})";

template <typename T>
void expect_same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(T)));
}

}  // namespace

TEST(XlaRuntime, CpuPluginClientAndDevices) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  Client& c = cpu();
  EXPECT_EQ(c.platform_name(), "cpu");
  EXPECT_EQ(c.device_count(), 2u);  // the cpu_device_count create option (the plugin's default is 4)
  EXPECT_EQ(c.device_descriptions().size(), 2u);
  EXPECT_EQ(c.plugin().api_major(), Plugin::header_major());
  EXPECT_GE(c.plugin().api_minor(), Plugin::header_minor());
  EXPECT_TRUE(c.plugin().attributes().count("stablehlo_current_version"));
  EXPECT_EQ(Plugin::load("cpu").get(), &c.plugin());  // loaded and initialised once per process
  EXPECT_EQ(c.plugin().path(), Plugin::resolve("cpu"));
}

TEST(XlaRuntime, PluginNamesAndMissingPaths) {
  OLMOSFT_CPU_PLUGIN_ONLY();  // (it unsets OLMOSFT_PJRT_CUDA)
  EXPECT_TRUE(Plugin::resolve("cpu").ends_with("deps/xla/cpu/xla_cpu_pjrt.so"));
  EXPECT_EQ(Plugin::resolve("/some/where/plugin.so"), "/some/where/plugin.so");
  EXPECT_NE(error_of([] { Plugin::resolve("gpu"); }).find("expected cpu, cuda, tpu or the path"),
            std::string::npos);
  unsetenv("OLMOSFT_PJRT_CUDA");
  EXPECT_TRUE(Plugin::resolve("cuda").ends_with("deps/xla/cuda/xla_cuda_plugin.so"))
      << Plugin::resolve("cuda");
  if (!std::filesystem::exists(Plugin::resolve("cuda"))) {  // install-deps.sh --cuda not run here
    EXPECT_NE(error_of([] { Plugin::load("cuda"); }).find("install-deps.sh --cuda or set OLMOSFT_PJRT_CUDA"),
              std::string::npos);
  }
  // The variables win (the image sets one per plugin); unset, cpu is the plugin under deps/xla again.
  setenv("OLMOSFT_PJRT_CPU", "/opt/olmosft/pjrt/cpu/xla_cpu_pjrt.so", 1);
  setenv("OLMOSFT_PJRT_CUDA", "/opt/x/xla_cuda_plugin.so", 1);
  EXPECT_EQ(Plugin::resolve("cpu"), "/opt/olmosft/pjrt/cpu/xla_cpu_pjrt.so");
  EXPECT_EQ(Plugin::resolve("cuda"), "/opt/x/xla_cuda_plugin.so");
  EXPECT_NE(error_of([] { Plugin::load("cpu"); }).find("set OLMOSFT_PJRT_CPU"), std::string::npos);
  unsetenv("OLMOSFT_PJRT_CPU");
  unsetenv("OLMOSFT_PJRT_CUDA");
  EXPECT_TRUE(Plugin::resolve("cpu").ends_with("deps/xla/cpu/xla_cpu_pjrt.so"));
  TempDir tmp;
  const std::string missing = (tmp.path / "no_such_plugin.so").string();
  const std::string msg = error_of([&] { Plugin::load(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
  const std::string junk = (tmp.path / "junk.so").string();
  std::ofstream(junk) << "not an ELF file";
  const std::string bad = error_of([&] { Plugin::load(junk); });
  EXPECT_NE(bad.find("cannot load the PJRT plugin " + junk), std::string::npos) << bad;
}

TEST(XlaRuntime, DifferentApiMajorIsRefusedNamingBoth) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  const std::string msg = error_of([] { Plugin::load(OLMOSFT_XLA_FAKE_PLUGIN_MAJOR); });
  const std::string theirs = std::to_string(Plugin::header_major() + 1) + ".0";
  const std::string ours =
      std::to_string(Plugin::header_major()) + "." + std::to_string(Plugin::header_minor());
  EXPECT_NE(msg.find("implements PJRT C API " + theirs), std::string::npos) << msg;
  EXPECT_NE(msg.find("built against API " + ours), std::string::npos) << msg;
  EXPECT_NE(msg.find(OLMOSFT_XLA_FAKE_PLUGIN_MAJOR), std::string::npos) << msg;
}

TEST(XlaRuntime, NewerMinorIsAcceptedAndMissingFunctionsAreNamed) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  auto p = Plugin::load(OLMOSFT_XLA_FAKE_PLUGIN_MINOR);
  EXPECT_EQ(p->api_major(), Plugin::header_major());
  EXPECT_EQ(p->api_minor(), Plugin::header_minor() + 1);
  // The stand-in has no client: the call that needs one says which function is missing.
  const std::string msg = error_of([&] { Client::create(p); });
  EXPECT_NE(msg.find("does not provide PJRT_Client_Create"), std::string::npos) << msg;
}

TEST(XlaRuntime, RoundTripsAreExact) {
  Client& c = cpu();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> f32{0.f, -0.f, 1.f,           -2.5f, 1e-45f,  3.4e38f,
                         inf, -inf, std::nanf(""), 0.1f,  1.f / 3, -7e-39f};
  auto b32 = c.to_device(std::span<const float>(f32), {3, 2, 2});
  EXPECT_EQ(b32.type(), (TensorType{ElementType::kF32, {3, 2, 2}}));
  expect_same_bytes(b32.to_host<float>(), f32);

  std::vector<double> f64{0.0, -0.0, 1e-310, 1.0 / 3, -1e300, std::numeric_limits<double>::quiet_NaN()};
  auto b64 = c.to_device(std::span<const double>(f64), {6});
  EXPECT_EQ(b64.type(), (TensorType{ElementType::kF64, {6}}));
  expect_same_bytes(b64.to_host<double>(), f64);

  std::vector<int32_t> s32{0, 1, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                           7};
  auto bs = c.to_device(std::span<const int32_t>(s32), {2, 3}, 1);  // on the second device
  EXPECT_EQ(bs.type(), (TensorType{ElementType::kS32, {2, 3}}));
  expect_same_bytes(bs.to_host<int32_t>(), s32);

  std::vector<uint16_t> bf16{0x0000, 0x8000, 0x3F80, 0xC020, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x7F7F};
  auto bb = c.to_device_bf16(bf16, {9});
  EXPECT_EQ(bb.type(), (TensorType{ElementType::kBF16, {9}}));
  expect_same_bytes(bb.to_host<uint16_t>(), bf16);

  std::vector<uint8_t> pred{1, 0, 0, 1};
  auto bp = c.to_device(pred.data(), TensorType{ElementType::kPred, {4}});
  expect_same_bytes(bp.to_host<uint8_t>(), pred);

  const float one = 42.f;
  auto scalar = c.to_device(&one, TensorType{ElementType::kF32, {}});
  EXPECT_EQ(scalar.to_host<float>(), std::vector<float>{42.f});
}

TEST(XlaRuntime, TransferErrorsAreClear) {
  Client& c = cpu();
  std::vector<float> v(6, 1.f);
  EXPECT_NE(error_of([&] {
              c.to_device(std::span<const float>(v), {4});
            }).find("6 host elements for shape tensor<4xf32>"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.to_device(std::span<const float>(v), {6}, 5); }).find("device 5 out of range"),
            std::string::npos);
  auto b = c.to_device(std::span<const float>(v), {2, 3});
  EXPECT_NE(error_of([&] { b.to_host<double>(); }).find("reading a tensor<2x3xf32> buffer into 8-byte"),
            std::string::npos);
}

TEST(XlaRuntime, CompileOptionsProtoBytes) {
  // executable_build_options (field 3, length 15): device_ordinal (1) = -1 as a 10-byte varint,
  // num_replicas (4) = 1, num_partitions (5) = 1.
  const std::string want =
      std::string("\x1a\x0f\x08", 3) + std::string(9, '\xff') + std::string("\x01\x20\x01\x28\x01", 5);
  EXPECT_EQ(compile_options_proto({}), want);
  CompileOptions spmd;
  spmd.num_partitions = 128;
  spmd.use_spmd_partitioning = true;
  spmd.device_ordinal = 0;
  // device_ordinal 0, num_replicas 1, num_partitions 128 (2-byte varint 0x80 0x01), use_spmd_partitioning
  // true.
  EXPECT_EQ(compile_options_proto(spmd), std::string("\x1a\x09\x08\x00\x20\x01\x28\x80\x01\x30\x01", 11));
  // env_option_overrides (field 7): a map entry {key "a" (1), value (2) {string_field "b" (1)}}.
  CompileOptions env;
  env.env_option_overrides = {{"a", "b"}};
  EXPECT_EQ(compile_options_proto(env), want + std::string("\x3a\x08\x0a\x01"
                                                           "a\x12\x03\x0a\x01"
                                                           "b",
                                                           10));
  EXPECT_NE(error_of([] {
              compile_options_proto(CompileOptions{0, 1, false, -1});
            }).find("num_replicas >= 1"),
            std::string::npos);
}

TEST(XlaRuntime, ExecuteWithoutAndWithDonation) {
  Client& c = cpu();
  Executable exe = c.compile(kAddModule);
  ASSERT_EQ(exe.num_outputs(), 1u);
  std::vector<float> a{1, 2, 3, 4}, b{10, 20, 30, 40};
  Buffer A = c.to_device(std::span<const float>(a), {4}), B = c.to_device(std::span<const float>(b), {4});
  Buffer* args[] = {&A, &B};

  // Not donated: the argument the module marks as donatable survives.
  std::vector<Buffer> out = exe.execute(args);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to_host<float>(), (std::vector<float>{11, 22, 33, 44}));
  EXPECT_FALSE(A.consumed());
  EXPECT_EQ(A.to_host<float>(), a);

  // Donated: argument 0 is consumed, argument 1 is not.
  const size_t donate[] = {0};
  out = exe.execute(args, donate);
  EXPECT_EQ(out[0].to_host<float>(), (std::vector<float>{11, 22, 33, 44}));
  EXPECT_TRUE(A.consumed());
  EXPECT_FALSE(B.consumed());
  EXPECT_EQ(B.to_host<float>(), b);
  EXPECT_NE(error_of([&] { A.to_host<float>(); }).find("was donated to an execution and is consumed"),
            std::string::npos);
  EXPECT_NE(error_of([&] { exe.execute(args); }).find("consumed"), std::string::npos);

  // Outputs are ordinary buffers: feed one back in.
  Buffer* again[] = {&out[0], &B};
  EXPECT_EQ(exe.execute(again)[0].to_host<float>(), (std::vector<float>{21, 42, 63, 84}));
}

TEST(XlaRuntime, PjrtErrorsCarryThePluginMessageAndTheCall) {
  OLMOSFT_CPU_PLUGIN_ONLY();  // device 1 and its name
  Client& c = cpu();
  const std::string msg = error_of([&] { c.compile("module { func.func @main() { bogus_op } }"); });
  EXPECT_NE(msg.find("PJRT_Client_Compile failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.plugin().path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("bogus_op"), std::string::npos) << msg;  // the plugin's own parse error

  Executable exe = c.compile(kAddModule);
  std::vector<float> a{1, 2, 3, 4};
  Buffer A = c.to_device(std::span<const float>(a), {4});
  Buffer* one[] = {&A};
  const std::string run = error_of([&] { exe.execute(one); });
  EXPECT_NE(run.find("PJRT_LoadedExecutable_Execute failed"), std::string::npos) << run;
  EXPECT_FALSE(A.consumed());

  Buffer on1 = c.to_device(std::span<const float>(a), {4}, 1);  // the executable runs on device 0
  Buffer* wrong_device[] = {&on1, &on1};
  const std::string dev = error_of([&] { exe.execute(wrong_device); });
  EXPECT_NE(dev.find("is on device TFRT_CPU_1"), std::string::npos) << dev;

  Client other = Client::create("cpu", ClientOptions{.cpu_device_count = 1});
  Buffer foreign = other.to_device(std::span<const float>(a), {4});
  Buffer* mixed[] = {&A, &foreign};
  EXPECT_NE(
      error_of([&] { exe.execute(mixed); }).find("argument 1 (tensor<4xf32>) belongs to another PJRT client"),
      std::string::npos);
}

TEST(XlaRuntime, BuffersAndExecutablesOutliveTheirClientObject) {
  std::optional<Buffer> kept;
  std::optional<Executable> exe;
  {
    Client c =
        Client::create(testutil::test_plugin(),
                       testutil::on_cpu_plugin() ? ClientOptions{.cpu_device_count = 1} : ClientOptions{});
    std::vector<float> a{5, 6, 7, 8};
    kept = c.to_device(std::span<const float>(a), {4});
    exe = c.compile(kAddModule);
  }
  Buffer* args[] = {&*kept, &*kept};
  EXPECT_EQ(exe->execute(args)[0].to_host<float>(), (std::vector<float>{10, 12, 14, 16}));
}

// SPMD: one program for both devices of the test client, split by XLA's partitioner. X [4, 8] is split by
// rows (device d holds rows 2d, 2d+1), W [8, 3] replicated; Y = X W comes back split by rows, G = X^T Y and
// sum(Y) replicated, which needs a cross-device sum the partitioner inserts. Checked against float64 and
// against the same module compiled for one device.
TEST(XlaRuntime, SpmdProgramSplitsRowsOverTwoDevices) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  Client& c = cpu();
  auto module = [](int64_t parts) {
    HloBuilder b("spmd");
    Value x = b.argument(TensorType{ElementType::kF32, {4, 8}});
    Value w = b.argument(TensorType{ElementType::kF32, {8, 3}});
    Value y = b.dot_general(x, w, DotDims{{}, {}, {1}, {0}});
    Value g = b.dot_general(x, y, DotDims{{}, {}, {0}, {0}});
    Value s = b.reduce_sum(y, {0, 1});
    b.returns({y, g, s});
    if (parts > 1) {
      b.partitions(parts);
      b.shard_argument(x, sharding_tiled({parts, 1}));
      b.shard_argument(w, sharding_replicated());
      b.shard_result(0, sharding_tiled({parts, 1}));
      b.shard_result(1, sharding_replicated());
      b.shard_result(2, sharding_replicated());
    }
    return b.module();
  };
  const std::string text = module(2);
  EXPECT_NE(text.find("module @spmd attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("%arg0: tensor<4x8xf32> {mhlo.sharding = \"{devices=[2,1]0,1}\"}"), std::string::npos)
      << text;
  EXPECT_NE(text.find("-> (tensor<4x3xf32> {mhlo.sharding = \"{devices=[2,1]0,1}\"}, tensor<8x3xf32> "
                      "{mhlo.sharding = \"{replicated}\"}"),
            std::string::npos)
      << text;
  std::vector<float> x(32), w(24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.7 * double(i) + 0.1));
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(std::cos(0.3 * double(i)));
  // float64 reference
  std::vector<double> y(12, 0.0), g(24, 0.0);
  double sum = 0;
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 8; ++k) y[r * 3 + j] += double(x[r * 8 + k]) * w[k * 3 + j];
      sum += y[r * 3 + j];
    }
  for (int k = 0; k < 8; ++k)
    for (int j = 0; j < 3; ++j)
      for (int r = 0; r < 4; ++r) g[k * 3 + j] += double(x[r * 8 + k]) * y[r * 3 + j];

  CompileOptions spmd;
  spmd.num_partitions = 2;
  spmd.use_spmd_partitioning = true;
  Executable exe = c.compile(text, spmd);
  std::vector<Buffer> xs, ws;
  for (size_t d = 0; d < 2; ++d) {
    xs.push_back(c.to_device(std::span<const float>(x.data() + 16 * d, 16), {2, 8}, d));
    ws.push_back(c.to_device(std::span<const float>(w), {8, 3}, d));
  }
  const std::vector<std::vector<Buffer*>> args = {{&xs[0], &ws[0]}, {&xs[1], &ws[1]}};
  std::vector<std::vector<Buffer>> out = exe.execute_partitioned(args);
  ASSERT_EQ(out.size(), 2u);
  for (size_t d = 0; d < 2; ++d) {
    ASSERT_EQ(out[d].size(), 3u);
    EXPECT_EQ(out[d][0].type().dims, (std::vector<int64_t>{2, 3})) << "device " << d << ": its rows of Y";
    EXPECT_EQ(out[d][1].type().dims, (std::vector<int64_t>{8, 3})) << "device " << d << ": all of G";
    const std::vector<float> yd = out[d][0].to_host<float>(), gd = out[d][1].to_host<float>();
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(yd[i], y[6 * d + i], 1e-5) << "device " << d << " Y " << i;
    for (size_t i = 0; i < 24; ++i) EXPECT_NEAR(gd[i], g[i], 1e-5 * 8) << "device " << d << " G " << i;
    EXPECT_NEAR(out[d][2].to_host<float>()[0], sum, 1e-5 * 12) << "device " << d;
  }
  // The same module for one device gives the same numbers (the partitioned sum adds two halves).
  Executable one = c.compile(module(1));
  Buffer x1 = c.to_device(std::span<const float>(x), {4, 8}),
         w1 = c.to_device(std::span<const float>(w), {8, 3});
  std::vector<Buffer*> a1 = {&x1, &w1};
  std::vector<Buffer> o1 = one.execute(a1);
  const std::vector<float> g1 = o1[1].to_host<float>(), g0 = out[0][1].to_host<float>();
  for (size_t i = 0; i < 24; ++i) EXPECT_NEAR(g1[i], g0[i], 1e-6 * 8) << i;
  // A device's argument count must match the others'.
  const std::vector<std::vector<Buffer*>> bad = {{&xs[0], &ws[0]}, {&xs[1]}};
  EXPECT_NE(error_of([&] { exe.execute_partitioned(bad); }).find("device 1 has 1 arguments, device 0 2"),
            std::string::npos);
}
