// Ahead-of-time compile (xla/pjrt.h: Topology, compile_for_topology, MemoryStats). XLA's CPU plugin cannot
// describe a topology nor compile without a client ("Topology not supported for CPU compilation", "No
// compiler registered for platform cpu", measured with its 0.0.1 wheel), so here: its clean refusal; the
// named values as they cross the C API (a stand-in plugin echoes them back); libtpu's topology options; the
// compiled memory statistics of a client compile, checked against the byte sizes of the arguments and
// outputs. The real thing with libtpu (a v4:2x2x1 topology, a compile for it, its statistics, an HBM
// overflow refused at compile time) is tests/xla-accel/xla_libtpu_test.cpp, which
// scripts/tpu-compile-check.sh runs after installing libtpu (an opt-in set-up, so not part of make test).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "xla/hlo_builder.h"
#include "xla/pjrt.h"
#include "xla_test_util.h"

using namespace olmosft;
using namespace olmosft::xla;
using testutil::error_of;
using testutil::kAlias;
using testutil::kArgBytes;
using testutil::kDotModule;
using testutil::kOutBytes;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(XlaAot, CpuPluginRefusesATopologyNamingTheCall) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  const std::string msg = error_of([] { Topology::create("cpu", "cpu"); });
  EXPECT_TRUE(contains(msg, "xla: PJRT_TopologyDescription_Create failed (PJRT plugin ")) << msg;
  EXPECT_TRUE(contains(msg, "xla_cpu_pjrt.so): UNIMPLEMENTED: Topology not supported for CPU")) << msg;
}

TEST(XlaAot, MissingFunctionsAreNamedAndTopologiesDestroyed) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  // The stand-in creates a topology named "ok" but has no other topology function and no PJRT_Compile.
  const std::string fake = OLMOSFT_XLA_FAKE_PLUGIN_MINOR;
  {
    const Topology t = Topology::create(fake, "ok");
    EXPECT_EQ(t.name(), "ok");
    EXPECT_TRUE(
        contains(error_of([&] { compile_for_topology(t, kDotModule); }),
                 "(API 0." + std::to_string(Plugin::header_minor() + 1) + ") does not provide PJRT_Compile"));
    EXPECT_TRUE(contains(error_of([&] { t.platform_name(); }),
                         "does not provide PJRT_TopologyDescription_PlatformName"));
    EXPECT_TRUE(contains(error_of([&] { t.device_count(); }),
                         "does not provide PJRT_TopologyDescription_GetDeviceDescriptions"));
    const Topology copy = t;  // shares the one PJRT topology
    EXPECT_TRUE(contains(error_of([] { Topology::create(OLMOSFT_XLA_FAKE_PLUGIN_MINOR, "x"); }), "live 1;"));
  }
  // Both copies gone: destroyed once.
  EXPECT_TRUE(contains(error_of([] { Topology::create(OLMOSFT_XLA_FAKE_PLUGIN_MINOR, "x"); }), "live 0;"));
}

TEST(XlaAot, NamedValuesCrossTheCApiTyped) {
  OLMOSFT_CPU_PLUGIN_ONLY();
  const std::vector<NamedValue> opts = {{"chip_config_name", std::string("megacore")},
                                        {"chips_per_host_bounds", std::vector<int64_t>{2, 2, 1}},
                                        {"num_slices", int64_t{3}},
                                        {"empty", std::vector<int64_t>{}},
                                        {"ratio", 0.5f},
                                        {"flag", true},
                                        {"off", false},
                                        {"s", std::string()}};
  const std::string msg =
      error_of([&] { Topology::create(OLMOSFT_XLA_FAKE_PLUGIN_MINOR, "v4:2x2x1", opts); });
  EXPECT_TRUE(contains(msg, "xla: PJRT_TopologyDescription_Create failed (PJRT plugin ")) << msg;
  EXPECT_TRUE(contains(msg,
                       "INVALID_ARGUMENT: live 0; topology v4:2x2x1: chip_config_name string[8] megacore; "
                       "chips_per_host_bounds int64_list[3] 2,2,1; num_slices int64 3; empty int64_list[0] ; "
                       "ratio float 0.500000; flag bool true; off bool false; s string[0] "))
      << msg;
  // No options at all: a null list and a count of 0.
  const std::string none = error_of([] { Topology::create(OLMOSFT_XLA_FAKE_PLUGIN_MINOR, "x"); });
  EXPECT_TRUE(none.ends_with("INVALID_ARGUMENT: live 0; topology x:")) << none;
  const std::string unnamed = error_of([] {
    Topology::create(OLMOSFT_XLA_FAKE_PLUGIN_MINOR, "x", std::vector<NamedValue>{{"", true}});
  });
  EXPECT_EQ(unnamed, "xla: a PJRT option has an empty name");
}

TEST(XlaAot, NamedValuesFormat) {
  const std::vector<NamedValue> v = {{"a", std::string("megacore")},
                                     {"b", std::vector<int64_t>{2, 2, 1}},
                                     {"c", int64_t{-1}},
                                     {"d", true},
                                     {"e", 0.25f}};
  EXPECT_EQ(format_named_values(v), "a=\"megacore\", b=[2,2,1], c=-1, d=true, e=0.25");
  EXPECT_EQ(format_named_values({}), "");
}

TEST(XlaAot, TpuTopologyOptions) {
  EXPECT_EQ(format_named_values(tpu_topology_options("v4:2x2x1")),
            "chip_config_name=\"megacore\", chips_per_host_bounds=[2,2,1], num_slices=1, wrap=[0,0,0]");
  // A torus from a full 4x4x4 cube on; smaller slices (2x4x4) are meshes.
  EXPECT_EQ(format_named_values(tpu_topology_options("v4:4x4x8")),
            "chip_config_name=\"megacore\", chips_per_host_bounds=[2,2,1], num_slices=1, wrap=[1,1,1]");
  EXPECT_TRUE(format_named_values(tpu_topology_options("v4:2x4x4")).ends_with("wrap=[0,0,0]"));
  const auto err = [](const char* t) { return error_of([&] { tpu_topology_options(t); }); };
  EXPECT_EQ(err("v4"), "xla: TPU topology `v4`: no `:` (expected v4:XxYxZ, e.g. v4:2x2x1)");
  EXPECT_EQ(
      err("v5e:2x2"),
      "xla: TPU topology `v5e:2x2`: generation `v5e` is not supported (expected v4:XxYxZ, e.g. v4:2x2x1)");
  EXPECT_TRUE(contains(err("v4:2x2"), "2 axes, a v4 slice has 3")) << err("v4:2x2");
  EXPECT_TRUE(contains(err("v4:2xax1"), "`a` is not a positive chip count")) << err("v4:2xax1");
  EXPECT_TRUE(contains(err("v4:0x2x1"), "`0` is not a positive chip count")) << err("v4:0x2x1");
  EXPECT_TRUE(contains(err("v4:2x2x"), "`` is not a positive chip count")) << err("v4:2x2x");
  EXPECT_TRUE(contains(err("v4:2x2x1 "), "`1 ` is not a positive chip count")) << err("v4:2x2x1 ");
}

TEST(XlaAot, CompiledMemoryStatsOfAClientCompile) {
  OLMOSFT_CPU_PLUGIN_ONLY();  // the byte counts below are the CPU plugin's dense layouts
  const Executable exe = testutil::test_client(2).compile(kDotModule);
  const MemoryStats m = exe.memory_stats();
  EXPECT_EQ(m.argument_bytes, kArgBytes);
  // Several results are a tuple: the CPU plugin counts its table of 2 pointers too (measured: 12,304).
  EXPECT_EQ(m.output_bytes, kOutBytes + 2 * 8);
  EXPECT_EQ(m.alias_bytes, kAlias);  // output 1 may live in argument 0's buffer
  EXPECT_GE(m.temp_bytes, 0);
  EXPECT_EQ(m.host_argument_bytes + m.host_output_bytes + m.host_temp_bytes, 0);
  EXPECT_EQ(m.total_bytes(), kArgBytes + m.output_bytes - kAlias + m.temp_bytes + m.generated_code_bytes);
  // Peak device memory: at least the arguments plus the outputs that do not reuse them.
  EXPECT_GE(m.peak_bytes, kArgBytes + kOutBytes - kAlias);
}

// The cost analysis (PJRT_Executable_GetCostAnalysis) of a client compile: kDotModule's product is 2 x 64 x
// 32 x 16 FLOPs, its add 64 x 32 (one per element); the same product in a loop of 4 iterations counts once
// per iteration only if XLA multiplies the body by its trip count, which it does not: what `olmosft xla
// compile` prints as the program's FLOPs is therefore a lower bound for programs with loops.
TEST(XlaAot, CostAnalysisOfAClientCompile) {
  OLMOSFT_CPU_PLUGIN_ONLY();  // the CPU plugin's HloCostAnalysis
  const auto client = testutil::test_client(1);
  const CostAnalysis c = client.compile(kDotModule).cost_analysis();
  ASSERT_TRUE(c.count("flops")) << "no flops property";
  const double dot = 2.0 * 64 * 32 * 16, add = 64 * 32;
  EXPECT_GE(c.at("flops"), dot);
  EXPECT_LE(c.at("flops"), dot + add);
  EXPECT_GT(c.at("bytes accessed"), double(kArgBytes));
  HloBuilder b("loop");
  const Value x = b.argument({ElementType::kF32, {64, 32}}), w = b.argument({ElementType::kF32, {32, 32}});
  const auto out = b.for_loop(4, {x, w}, [](HloBuilder& b, const Value&, const std::vector<Value>& v) {
    return std::vector<Value>{b.dot_general(v[0], v[1], DotDims{{}, {}, {1}, {0}}), v[1]};
  });
  b.returns({out[0]});
  const CostAnalysis l = client.compile(b.module()).cost_analysis();
  const double body = 2.0 * 64 * 32 * 32;
  std::printf("loop of 4 products of %.0f FLOPs each: cost analysis flops %.0f\n", body, l.at("flops"));
  EXPECT_GE(l.at("flops"), body);
  EXPECT_LT(l.at("flops"), 2 * body);  // the body once
}
