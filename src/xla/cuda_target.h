// Compiling for NVIDIA GPUs without one (docs/xla.md "Ahead-of-time compile for a GPU cluster"): XLA's CUDA
// plugin describes a cluster it does not have from two topology options, `target_config` (the text of a
// stream_executor.GpuTargetConfigProto: the GPU's SMs, memory, clocks) and `topology`
// ("<partitions>x<hosts>x<gpus per host>"), then compiles with the client-less PJRT_Compile; it needs the
// CUDA toolkit's libcudart, libnvJitLink and libdevice (never libcuda, never a GPU).
//
// The target specs are the plugin's own: it carries XLA's GpuTargetConfigProto texts (Apache-2.0, as the
// plugin) as NUL-terminated strings, each ending with its `device_description_str`; cuda_target reads the
// one for a GPU out of the installed plugin file, so spec and compiler always come from the same XLA build.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xla/pjrt.h"

namespace olmosft::xla {

// A GPU cluster as a user spells it: `h100:2x8` (2 hosts of 8 GPUs, H100 SXM); also h200, b200.
struct GpuCluster {
  std::string gpu;  // the spelling's GPU name (h100)
  int64_t hosts = 0, gpus_per_host = 0;
  int64_t devices() const { return hosts * gpus_per_host; }
};
// Parses SPEC; throws naming it and the known GPU names on another spelling.
GpuCluster parse_gpu_cluster(std::string_view spec);
// The GPU names parse_gpu_cluster knows, joined by ", ".
std::string gpu_names();
// XLA's device description for GPU (h100 -> "NVIDIA H100 80GB HBM3"), refused as parse_gpu_cluster.
std::string gpu_device_description(std::string_view gpu);

// One GPU's spec as the plugin carries it.
struct GpuTarget {
  std::string description;   // "NVIDIA H100 80GB HBM3"
  std::string text;          // the GpuTargetConfigProto text, as passed in `target_config`
  int64_t memory_bytes = 0;  // its gpu_device_info.device_memory_size
  int64_t core_count = 0;    // SMs
};
// Reads GPU's spec out of the plugin file PLUGIN_PATH. Throws naming the file and GPU when the plugin has no
// such text, or when the text is not a GpuTargetConfigProto with a gpu_device_info, a device_memory_size and
// a core_count (a plugin whose embedded specs changed form: refused, never guessed).
GpuTarget cuda_target(const std::string& plugin_path, std::string_view gpu);
// The topology options for TARGET on CLUSTER: target_config and topology "1x<hosts>x<gpus per host>".
std::vector<NamedValue> cuda_topology_options(const GpuTarget& target, const GpuCluster& cluster);

// The CUDA toolkit parts scripts/install-deps.sh --cuda unpacks from NVIDIA's wheels beside the plugin
// (PLUGIN_PATH's ../nvidia/cu13: lib/libcudart.so.13, lib/libnvJitLink.so.13, nvvm/libdevice/libdevice.10.bc,
// the layout the plugin's RPATH names), or "" when its libdevice is not there (a system toolkit serves).
std::string cuda_wheel_root(const std::string& plugin_path);

// The share of a GPU's memory a run's client lets XLA allocate (the CUDA plugin's `memory_fraction` create
// option, which XlaDecoder passes): the rest is the CUDA context, NCCL's buffers and cuBLAS/cuDNN workspaces
// outside XLA's allocator. A compiled plan's budget is this share of the GPU's memory.
constexpr double kCudaMemoryFraction = 0.90;

}  // namespace olmosft::xla
