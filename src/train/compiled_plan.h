// `olmosft plan --compile TOPOLOGY RECIPE` (docs/plan.md "Compiled plans"): the recipe's real step program
// for the slice's mesh, compiled ahead of time by the accelerator's own compiler on this machine (libtpu for
// a TPU slice; no device needed), and its per-device memory against the device's: what a run will need on
// the device, measured by the compiler rather than estimated.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/decoder_xla.h"
#include "train/recipe.h"
#include "xla/hlo_loops.h"
#include "xla/mesh.h"

namespace olmosft::train {

struct CompiledPlan {
  std::string topology;  // as given: tpu-v4:4x4x8
  std::string platform, device_kind;
  int64_t devices = 0;
  xla::Mesh mesh;
  int64_t B = 0, T = 0;  // the micro-batch the program is for: rows over all devices, tokens per row
  double emit_s = 0, compile_s = 0;
  int64_t argument_bytes = 0, output_bytes = 0, alias_bytes = 0, temp_bytes = 0, code_bytes = 0;
  int64_t step_bytes = 0;  // the step program's per-device total (arguments + outputs - alias + temp + code)
  int64_t moments_bytes = 0;  // AdamW's two fp32 moments per device, resident beside the step
  int64_t sums_bytes = 0;     // the gradient sums kept between micro-steps (gradient accumulation > 1)
  int64_t need_bytes = 0;     // step_bytes + moments_bytes + sums_bytes
  int64_t device_bytes = 0;   // the device's memory as its compiler states it
  bool fits = false;
  // The collectives the partitioner put inside loops (xla/hlo_loops.h), as it left the program.
  std::vector<xla::LoopCollective> loop_collectives;
  // The process (host) each partition runs in: partition d on the topology's device of id d (XLA's default
  // device assignment for an SPMD program), -1 where the topology has no such id.
  std::vector<int64_t> partition_process;
};

// The XLA backend's options a recipe gives (device: xla; the xla.*, mesh.*, model.remat and compute.dtype
// keys): what `olmosft train` runs and, with the slice's plugin, `plan --compile` compiles.
model::XlaOptions recipe_xla_options(const TrainConfig& c);

// Compiles CFG's step (its mesh, remat, scanned layers, compute dtype, loss settings; B = the rows of a
// micro-step over all the slice's devices, T = seq_len) for TOPOLOGY: `tpu-v4:XxYxZ` through libtpu
// (scripts/install-deps.sh --tpu), or a GPU cluster `h100:HOSTSxGPUS` (also h200, b200) through XLA's CUDA
// plugin with no GPU (--cuda; xla/cuda_target.h), whose device budget is xla::kCudaMemoryFraction of the
// GPU's memory (XLA does not refuse a program larger than a GPU: the caller compares). Throws naming the
// topology or key: another spelling, a mesh whose devices are not the slice's, a program the compiler refuses
// (libtpu refuses one that cannot fit: then fits=false is not reached, the compiler's message is).
CompiledPlan compile_plan(const model::ModelConfig& m, const TrainConfig& cfg, const std::string& topology);
// `PLAN-PROCESSES processes=P devices_per_process=K row_groups=G row_groups_across_processes=X`: how the
// mesh's row groups (the devices sharing one row's pieces, xla::sequence_groups) fall on the hosts; on a GPU
// cluster a group that spans hosts is a `PLAN-WARNING rows_across_processes` line (its context-parallel and
// expert gathers leave NVLink for the network). A TPU slice's rows span hosts over ICI as designed.
std::string compiled_plan_process_lines(const CompiledPlan& p);
// The devices of TOPOLOGY (its chips or GPUs), refused as compile_plan refuses its spelling.
int64_t slice_devices(const std::string& topology);
// The planner's device (train/plan.h parse_device) for TOPOLOGY's chips: tpu-v4, h100-80gb, ...
std::string planner_device(const std::string& topology);

// PLAN compiled=yes topology=... devices=... mesh=... B=... T=... argument_bytes=... output_bytes=...
// temp_bytes=... code_bytes=... step_bytes=... moments_bytes=... sums_bytes=... need_bytes=...
// device_bytes=... planned_bytes=... fits=yes|no compile_s=...: one greppable line (PLANNED: the planner's
// estimate of the same device's bytes, 0 when it has none), and its parse for tests.
std::string compiled_plan_line(const CompiledPlan& p, int64_t planned_bytes);
// PLAN-LOOPS layer_scan_collectives=N unwanted_collectives=M, then one line per unwanted one
// (xla::unwanted_loop_collective: inside a delta-rule, attention or cross-entropy loop):
// PLAN-WARNING collective_in_loop op=all-gather loop=olmosft.delta_rule computation=... hlo=...
std::string compiled_plan_loop_lines(const CompiledPlan& p);
// The same for people: "compiled for tpu-v4:4x4x8 (128 x TPU v4, mesh ...): per device 12.62 GiB of 30.75
// ...".
std::string compiled_plan_summary(const CompiledPlan& p, int64_t planned_bytes);

}  // namespace olmosft::train
