// The memory and compute plan of a training run (`olmosft plan`, and the trainer's preflight): per device
// and by part, the bytes a step needs (weights, gradients, AdamW moments, saved activations and working
// set, MoE dispatch buffers, cross-entropy tiles, communication buffers), the FLOPs per step and the time
// they imply at a stated MFU, whether that fits the device and, when it does not, the first of a fixed list
// of changes that makes it fit. It reads only the model's config.json (never the weights) and the recipe.
// The formulas are in docs/plan.md; the activation figures come from model::activation_bytes (the plan the
// models carve their workspace with), the MoE and cross-entropy ones from the kernels' own size functions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "train/recipe.h"

namespace olmosft::train {

enum class DeviceKind { Cpu, Gpu, Tpu };

// One device: a CPU process with its share of RAM, or an accelerator with its memory.
struct PlanDevice {
  std::string name;  // "cpu", "cpu-64gib", "h100-80gb", "h200-141gb", "a100-80gb", "tpu-v4"
  DeviceKind kind = DeviceKind::Cpu;
  double memory = 0;  // bytes per device
  double peak_flops =
      0;               // dense bf16 FLOP/s per device (accelerators); CPU: 0 unless given (perf.peak_tflops)
  std::string origin;  // where `memory` comes from (one phrase)
};

// The accelerator table (name, memory, peak): h100-80gb, h200-141gb, a100-80gb, tpu-v4.
const std::vector<PlanDevice>& accelerator_devices();
// "cpu" (this machine: MemTotal, or the cgroup limit memory.max when lower, divided by local_processes),
// "cpu-<N>gib" (N GiB per process) or an accelerator name. Anything else throws naming `where` and the
// choices.
PlanDevice parse_device(const std::string& spec, int64_t local_processes, const std::string& where);
// This machine's memory for training processes: min(MemTotal, cgroup memory.max) in bytes (0 if unknown).
double local_memory_bytes();

struct PlanOptions {
  PlanDevice device;
  double headroom = 0.9;  // the fraction of device memory a plan may use
  double mfu = 0.4;       // model FLOPs utilisation the step time is stated at
  int64_t threads = 0;    // CPU threads per process (the MoE expert loop's parallelism); 0 = current
};

struct PlanPart {
  std::string name;
  double bytes = 0;  // per device
  std::string note;
  bool transient = false;  // held inside one layer's kernel call: only the largest transient counts
};

struct MemoryPlan {
  PlanOptions opt;
  TrainConfig cfg;  // the settings planned (Derived batch included)
  int64_t params = 0;
  double rows = 0;  // rows per device per micro-step (fractional: a row spread over 1/rows devices)
  std::vector<PlanPart> parts;
  double step_peak = 0;  // the parts held through the step plus the largest transient part
  double load_peak = 0;  // while the weights are loaded and sharded (0 on accelerators: host memory)
  double budget = 0;     // headroom x device memory
  bool fits = false;
  double flops_per_step = 0, seconds_per_step = 0;  // seconds: 0 when the peak FLOP/s is unknown
  std::string change;       // the first change that fits (the override text), "" when it fits or none does
  std::string change_note;  // what that change costs / its peak, or why nothing fits
  double peak() const { return step_peak > load_peak ? step_peak : load_peak; }
};

// Plans `cfg` for model config `m` on opt.device. Throws olmosft::Error naming the recipe and key for an
// impossible mesh (devices x per_device_batch not dividing global_batch, fractional rows on a CPU, a row
// split over a number of devices that does not divide `devices`).
MemoryPlan plan_memory(const model::ModelConfig& m, const TrainConfig& cfg, const PlanOptions& opt);
// plan_memory and, when it does not fit, the first change that does: more devices (zero3), model.remat
// none -> attn -> full, a smaller per_device_batch, a smaller moe.buffer_factor; then all of them at once.
MemoryPlan make_plan(const model::ModelConfig& m, const TrainConfig& cfg, const PlanOptions& opt);

// The table `olmosft plan` prints, ending with one machine-readable `PLAN fits=...` line.
std::string format_plan(const MemoryPlan& p);
// The refusal: what does not fit, by how much, and the change (one paragraph).
std::string refusal(const MemoryPlan& p);

// The trainer's preflight: the plan of `cfg` for `m` on this machine's CPU shared by `local_processes`;
// throws olmosft::Error with refusal() when it does not fit. Returns the plan. With device: xla on an
// accelerator (xla.plugin not cpu) only the host's parts are planned (the fp32 master, gradients, moments,
// runtime): the step itself is on the device, where XLA sizes it at compile.
MemoryPlan require_fit(const model::ModelConfig& m, const TrainConfig& cfg, int64_t local_processes);
// One line for the trainer's log: "PREFLIGHT memory_plan peak_gib=... budget_gib=... per process (...)".
std::string preflight_line(const MemoryPlan& p);
// The processes of this job on this machine: OMPI_COMM_WORLD_LOCAL_SIZE when set, else `world`.
int64_t local_processes(int64_t world);

// The model config a recipe trains: model.init's config.json or model.config (never the weights).
model::ModelConfig recipe_model_config(const TrainConfig& cfg);
// The same, or, when model.init names a directory that cannot be read here (a cluster volume: the recipe is
// planned on another machine), the preset whose name its directory's name matches (olmo35-small* and
// olmo3moe-small*: olmo3moe-small; Olmo-3-*7B / olmo3-7b*: olmo3-7b; olmo-hybrid-7b*: olmo-hybrid-7b), with
// *NOTE saying so. Throws recipe_model_config's error, plus the advice to pass --model, when none matches.
model::ModelConfig recipe_model_config_or_preset(const TrainConfig& cfg, std::string* note);
// The preset a model directory's name matches ("" for none): the rule above.
std::string preset_for_model_name(const std::string& dir);

// ---- formulas that other work changes (kept in one place each; docs/plan.md) -----------------------
// Gradient bytes per rank. dp: the full-size accumulator plus the reduced copy kept between steps
// (2 x 4P). zero3: each unit's gradient is reduce-scattered as soon as its backward is done
// (docs/dist.md), so the 1/N shard plus one unit's full-size pages: 4P/N + 4 x largest_unit.
double gradient_bytes(int64_t params, int64_t ranks, bool zero3, int64_t largest_unit);
// Peak bytes while loading: each rank reads only its shard's bytes (params, gradients, m, v: 16P / shard)
// plus one tensor at a time in fp32 (random init builds a whole tensor and keeps the owned part; HF
// files are read in ranges): 16P / shard + 4 x largest_tensor.
double load_bytes(int64_t params, int64_t shard, int64_t largest_tensor);

}  // namespace olmosft::train
