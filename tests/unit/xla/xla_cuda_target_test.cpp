// GPU clusters and their target specs for deviceless CUDA compiles (xla/cuda_target.h): the spellings, the
// GpuTargetConfigProto texts read out of the installed CUDA plugin (scripts/install-deps.sh --cuda, which
// `make test` runs), and the refusals of a plugin without a spec or with one of another form.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "xla/cuda_target.h"
#include "xla_test_util.h"

using namespace olmosft;
using namespace olmosft::xla;
using testutil::error_of;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A file holding BYTES (a stand-in for a plugin binary), removed with the object.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& bytes) {
    path = (std::filesystem::temp_directory_path() / ("olmosft_cuda_target_" + std::to_string(::getpid())))
               .string();
    std::ofstream(path, std::ios::binary) << bytes;
  }
  ~TempFile() { std::filesystem::remove(path); }
};

}  // namespace

TEST(XlaCudaTarget, ClusterSpellings) {
  const GpuCluster c = parse_gpu_cluster("h100:2x8");
  EXPECT_EQ(c.gpu, "h100");
  EXPECT_EQ(c.hosts, 2);
  EXPECT_EQ(c.gpus_per_host, 8);
  EXPECT_EQ(c.devices(), 16);
  EXPECT_EQ(parse_gpu_cluster("b200:1x4").devices(), 4);
  EXPECT_EQ(gpu_device_description("h200"), "NVIDIA H200 141GB HBM3e");
  for (const char* bad : {"h100", "h100:2", "h100:0x8", "h100:2x8x1", "h100:-1x8", "h100:2x", ":2x8"})
    EXPECT_TRUE(contains(error_of([&] { parse_gpu_cluster(bad); }), "expected GPU:HOSTSxGPUS_PER_HOST"))
        << bad;
  EXPECT_EQ(error_of([] { parse_gpu_cluster("a100:2x8"); }),
            "xla: unknown GPU 'a100' (expected one of h100, h200, b200)");
}

TEST(XlaCudaTarget, SpecsComeFromTheInstalledPlugin) {
  const std::string plugin = Plugin::resolve("cuda");
  ASSERT_TRUE(std::filesystem::exists(plugin))
      << plugin << ": make test installs it (install-deps.sh --cuda)";
  // XLA's own figures for these GPUs (its gpu_specs/*.txtpb, as the plugin carries them).
  const GpuTarget h100 = cuda_target(plugin, "h100");
  EXPECT_EQ(h100.description, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(h100.memory_bytes, 84942979072);
  EXPECT_EQ(h100.core_count, 132);
  EXPECT_TRUE(h100.text.starts_with("# Copyright")) << h100.text.substr(0, 80);
  EXPECT_TRUE(h100.text.ends_with("device_description_str: \"NVIDIA H100 80GB HBM3\"\n"));
  EXPECT_EQ(cuda_target(plugin, "h200").memory_bytes, 151397597184);
  EXPECT_EQ(cuda_target(plugin, "b200").core_count, 148);
  // install-deps.sh --cuda's toolkit parts beside it (the deviceless compile's libdevice root).
  const std::string root = cuda_wheel_root(plugin);
  EXPECT_TRUE(root.ends_with("/nvidia/cu13")) << root;
  EXPECT_TRUE(std::filesystem::exists(root + "/lib/libnvJitLink.so.13")) << root;
  EXPECT_EQ(cuda_wheel_root("/nonexistent/cuda/xla_cuda_plugin.so"), "");
  const auto opts = cuda_topology_options(h100, parse_gpu_cluster("h100:2x8"));
  ASSERT_EQ(opts.size(), 2u);
  EXPECT_EQ(opts[0].name, "target_config");
  EXPECT_EQ(std::get<std::string>(opts[0].value), h100.text);
  EXPECT_EQ(opts[1].name, "topology");
  EXPECT_EQ(std::get<std::string>(opts[1].value), "1x2x8");
}

TEST(XlaCudaTarget, APluginWithoutTheSpecOrWithAnotherFormIsRefused) {
  const TempFile none(std::string("ELF\0no specs here\0", 19));
  EXPECT_TRUE(contains(error_of([&] { cuda_target(none.path, "h100"); }),
                       "carries no target spec for NVIDIA H100 80GB HBM3 (h100)"));
  // The description line without a GpuTargetConfigProto around it (or without its memory size).
  const TempFile odd(
      std::string("\0gpu_device_info {\n  core_count: 132\n}\n"
                  "device_description_str: \"NVIDIA H100 80GB HBM3\"\n\0",
                  88));
  EXPECT_TRUE(
      contains(error_of([&] { cuda_target(odd.path, "h100"); }),
               "is not a stream_executor.GpuTargetConfigProto with gpu_device_info, device_memory_size"));
  EXPECT_TRUE(contains(error_of([] { cuda_target("/nonexistent/xla_cuda_plugin.so", "h100"); }),
                       "cannot open the CUDA plugin /nonexistent/xla_cuda_plugin.so"));
}

// The create option XlaDecoder passes the CUDA plugin (memory_fraction: the budget plan --compile checks
// against) is one it knows: on this machine creation then stops at "no GPU", after the plugin validated the
// options; an unknown option is refused by name before that.
TEST(XlaCudaTarget, TheClientsMemoryFractionIsAnOptionThePluginKnows) {
  const auto create = [](std::vector<NamedValue> extra) {
    return error_of([&] { Client::create("cuda", ClientOptions{.extra = extra}); });
  };
  const std::string ok = create({{"memory_fraction", float(kCudaMemoryFraction)}});
  const std::string bad = create({{"memory_fractionx", float(kCudaMemoryFraction)}});
  EXPECT_TRUE(ok.empty() || contains(ok, "FAILED_PRECONDITION: No visible GPU devices")) << ok;  // "": a GPU
  EXPECT_TRUE(contains(bad,
                       "INVALID_ARGUMENT: Unexpected option name passed to PJRT_Client_Create: "
                       "memory_fractionx"))
      << bad;
}
