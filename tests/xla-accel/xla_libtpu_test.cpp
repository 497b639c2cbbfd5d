// The ahead-of-time compile with libtpu (xla/pjrt.h: Topology, compile_for_topology, MemoryStats) for a TPU
// v4:2x2x1 slice on a CPU-only machine: the topology's devices and HBM, a compile for it and its statistics,
// and an HBM overflow refused at compile time. libtpu is an opt-in set-up (scripts/install-deps.sh --tpu), so
// this is not a ctest test: scripts/tpu-compile-check.sh builds and runs it after installing libtpu, and it
// fails (never skips) when libtpu is absent.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../unit/xla/xla_test_util.h"
#include "xla/pjrt.h"

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

// libtpu, when installed: a real ahead-of-time compile for a TPU v4 slice on this CPU-only machine.
TEST(XlaAot, LibtpuCompilesForAV4Slice) {
  const std::string path = Plugin::resolve("tpu");
  ASSERT_TRUE(std::filesystem::is_regular_file(path))
      << "libtpu not installed at " << path << " (scripts/install-deps.sh --tpu, or set OLMOSFT_PJRT_TPU)";
  setenv("TPU_SKIP_MDS_QUERY", "1", 0);  // no TPU here: do not ask the cloud metadata server
  setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1", 0);
  // libtpu's logs into this test's own folder, not /tmp/tpu_logs (kept for the process: libtpu may write
  // until exit).
  std::string logs = (std::filesystem::temp_directory_path() / "olmosft_xla_aot_XXXXXX").string();
  if (std::getenv("TPU_LOG_DIR") == nullptr && mkdtemp(logs.data()) != nullptr)
    setenv("TPU_LOG_DIR", logs.c_str(), 1);
  const Topology t = Topology::create("tpu", "v4:2x2x1", tpu_topology_options("v4:2x2x1"));
  EXPECT_EQ(t.platform_name(), "tpu");
  EXPECT_EQ(t.device_count(), 4u);  // megacore: one device per chip of the 2x2x1 slice
  EXPECT_EQ(t.device_kinds().at(0), "TPU v4");
  const auto attrs = t.attributes();
  ASSERT_TRUE(attrs.count("device_memory_bytes_limit"));
  const int64_t hbm = std::stoll(attrs.at("device_memory_bytes_limit"));
  EXPECT_GT(hbm, int64_t{30} << 30);  // 30.75 GiB usable of a v4 chip's 32 GiB
  EXPECT_LE(hbm, int64_t{32} << 30);
  EXPECT_EQ(attrs.at("wrap"), "0.0.0");

  const AotExecutable exe = compile_for_topology(t, kDotModule);
  EXPECT_EQ(exe.num_outputs(), 2u);
  const MemoryStats m = exe.memory_stats();
  // TPU layouts pad the minor dimensions to tiles, so at least the dense sizes.
  EXPECT_GE(m.argument_bytes, kArgBytes);
  EXPECT_GE(m.output_bytes, kOutBytes);
  EXPECT_GE(m.alias_bytes, kAlias);
  EXPECT_GT(m.generated_code_bytes, 0);
  EXPECT_LT(m.total_bytes(), int64_t{16} << 20);

  // 40 GiB of output cannot fit a chip: refused when compiled, naming HBM.
  const char* huge = R"(module @huge {
  func.func public @main(%arg0: tensor<f32>) -> (tensor<4096x4096x640xf32>) {
    %0 = "stablehlo.broadcast_in_dim"(%arg0) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<4096x4096x640xf32>
    "func.return"(%0) : (tensor<4096x4096x640xf32>) -> ()
  }
})";
  const std::string msg = error_of([&] { compile_for_topology(t, huge); });
  EXPECT_TRUE(contains(msg, "PJRT_Compile failed")) << msg;
  EXPECT_TRUE(contains(msg, "RESOURCE_EXHAUSTED")) << msg;
  EXPECT_TRUE(contains(msg, "HBM")) << msg;
}
