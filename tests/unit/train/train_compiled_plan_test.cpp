// `olmosft plan --compile` for a GPU cluster (train/compiled_plan.h): the recipe's step compiled by XLA's
// CUDA plugin with no GPU (scripts/install-deps.sh --cuda, which `make test` runs; the CUDA toolkit's
// libcudart, libnvJitLink and libdevice) for 2 hosts x 8 H100, 16-way SPMD; the compiler's per-device
// argument and output bytes must be the shard sizes the mesh's rules give (xla/mesh.h), so the program the
// compiler saw is the partitioned one. A TPU slice is tests/xla-accel/xla_libtpu_test.cpp (libtpu is an
// opt-in install).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/decoder_xla.h"
#include "model/params.h"
#include "train/compiled_plan.h"
#include "train/plan.h"
#include "train/recipe.h"
#include "xla/mesh.h"

using namespace olmosft;

namespace {

TrainConfig gpu_recipe(const std::string& mesh, const std::string& per_device_batch = "") {
  const std::string pdb = !per_device_batch.empty()                   ? per_device_batch
                          : mesh.find("context") == std::string::npos ? "1"
                                                                      : "0.125";
  const std::string yaml = std::string("model:\n  init: ") + OLMOSFT_GOLDEN_DIR +
                           "/model/olmo3_tiny\ndevice: xla\nxla:\n  plugin: cuda\nmesh: " + mesh +
                           "\nseq_len: 256\nglobal_batch: 16\ndevices: 16\nper_device_batch: " + pdb +
                           "\nsteps: 1\ndata:\n  path: /nonexistent\n";
  return Recipe::parse(yaml, "gpu.yaml", {}).config();
}

}  // namespace

TEST(TrainCompiledPlan, SixteenH100sCompileWithoutAGpuAndArgumentsAreTheShards) {
  const TrainConfig cfg = gpu_recipe("{fsdp: 16}");
  const model::ModelConfig m = train::recipe_model_config(cfg);
  const train::CompiledPlan p = train::compile_plan(m, cfg, "h100:2x8");
  EXPECT_EQ(p.devices, 16);
  EXPECT_EQ(p.platform, "cuda");
  EXPECT_EQ(p.device_kind, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(p.device_bytes, int64_t(84942979072 * 0.90));  // xla::kCudaMemoryFraction of XLA's H100 spec
  EXPECT_EQ(p.B, 16);
  EXPECT_EQ(p.T, 256);
  // Expected per device: each parameter's part (split along its first dimension the 16 shards divide, else
  // whole), each [N] batch array's tile (N = B x T over 16 devices), the scalars whole.
  model::XlaOptions xo;
  xo.mesh = xla_mesh(cfg);
  const model::XlaStepProgram prog = model::xla_step_program(m, xo, p.B, p.T, model::LossConfig{});
  const auto registry = model::param_registry(m);
  int64_t args = 0, grads = 0, split = 0;
  for (size_t i = 0; i < prog.arguments.size(); ++i) {
    const model::XlaStepTensor& a = prog.arguments[i];
    int64_t n = 1;
    for (int64_t d : a.dims) n *= d;
    int64_t part = n;
    if (i < registry.size()) {
      if (xla::param_split_dim(xo.mesh, a.dims) >= 0) part = n / 16, ++split;
      grads += 4 * part;  // its gradient, split as the parameter
    } else if (n == p.B * p.T) {
      part = n / 16;
    }
    args += 4 * part;  // f32 and s32 alike
  }
  EXPECT_GT(split, int64_t(registry.size()) / 2) << "most parameters split over the 16 devices";
  int64_t outs = 0;  // the gradients split as their parameters, the sums and statistics whole
  for (const model::XlaStepTensor& r : prog.results) {
    int64_t n = 1;
    for (int64_t d : r.dims) n *= d;
    outs += 4 * (r.name.rfind("grad.", 0) == 0 && xla::param_split_dim(xo.mesh, r.dims) >= 0 ? n / 16 : n);
  }
  EXPECT_EQ(p.argument_bytes, args);
  // XLA:GPU's result is a tuple: its output bytes also count the tuple's table of 8-byte buffer pointers.
  EXPECT_EQ(p.output_bytes, outs + 8 * int64_t(prog.results.size()));
  EXPECT_GE(outs, grads);
  EXPECT_EQ(p.moments_bytes, 2 * grads);
  EXPECT_EQ(p.sums_bytes, 0);  // 16 rows a micro-step: no accumulation
  EXPECT_EQ(p.need_bytes, p.step_bytes + p.moments_bytes);
  EXPECT_GT(p.temp_bytes, 0);
  EXPECT_TRUE(p.fits);
  // The line says what was compiled.
  const std::string line = train::compiled_plan_line(p, 0);
  EXPECT_EQ(
      line.rfind("PLAN compiled=yes topology=h100:2x8 devices=16 mesh=data=1,fsdp=16,expert=1,context=1 "
                 "B=16 T=256 argument_bytes=" +
                     std::to_string(args) + " ",
                 0),
      0u)
      << line;
}

// A row over all 16 GPUs (context 16) spans both hosts: warned about, naming the fix.
TEST(TrainCompiledPlan, RowsAcrossHostsAreWarnedAbout) {
  const TrainConfig cfg = gpu_recipe("{context: 16}", "0.0625");
  const train::CompiledPlan p = train::compile_plan(train::recipe_model_config(cfg), cfg, "h100:2x8");
  const std::string lines = train::compiled_plan_process_lines(p);
  EXPECT_EQ(
      lines.rfind("PLAN-PROCESSES processes=2 devices_per_process=8 row_groups=1 "
                  "row_groups_across_processes=1\nPLAN-WARNING rows_across_processes groups=1 of 1: each "
                  "row's 16 pieces (mesh expert x context) span hosts",
                  0),
      0u)
      << lines;
  EXPECT_NE(lines.find("make expert x context divide the GPUs of a host, 8)"), std::string::npos) << lines;
}

TEST(TrainCompiledPlan, ContextParallelOverAHostAndRefusals) {
  // Each row's 256 tokens over the 8 GPUs of a host (context is the mesh's innermost axis), rows over fsdp.
  const TrainConfig cfg = gpu_recipe("{fsdp: 2, context: 8}");
  const model::ModelConfig m = train::recipe_model_config(cfg);
  const train::CompiledPlan p = train::compile_plan(m, cfg, "h100:2x8");
  EXPECT_EQ(p.B, 2);
  // The CUDA plugin's 2 hosts: GPUs 0-7 in process 0, 8-15 in process 1; each row's 8 pieces on one host.
  std::vector<int64_t> hosts(16, 0);
  std::fill(hosts.begin() + 8, hosts.end(), 1);
  EXPECT_EQ(p.partition_process, hosts);
  EXPECT_EQ(train::compiled_plan_process_lines(p),
            "PLAN-PROCESSES processes=2 devices_per_process=8 row_groups=2 row_groups_across_processes=0\n");
  EXPECT_EQ(p.sums_bytes, p.moments_bytes / 2);  // 8 micro-steps: the sums stay on the devices between them
  EXPECT_EQ(p.need_bytes, p.step_bytes + p.moments_bytes + p.sums_bytes);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(train::slice_devices("h200:4x8"), 32);
  EXPECT_EQ(train::planner_device("h100:2x8"), "h100-80gb");
  EXPECT_EQ(train::planner_device("tpu-v4:2x2x1"), "tpu-v4");
  std::string e;
  try {
    train::compile_plan(m, cfg, "h100:1x8");
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("the mesh (data=1 fsdp=2 expert=1 context=8) has 16 devices, but h100:1x8 has 8"),
            std::string::npos)
      << e;
  e.clear();
  try {
    train::slice_devices("a100:2x8");
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("expected tpu-v4:XxYxZ (a TPU slice, compiled by libtpu) or GPU:HOSTSxGPUS"),
            std::string::npos)
      << e;
}
