// The trainer recipe as far as the cluster launcher needs it: a YAML file plus `key=value` overrides
// (dotted keys, e.g. cluster.stop_rules.nan_loss=false; values are YAML, so mesh={fsdp: 16} works). The
// whole file is read with the trainer's reader into a TrainConfig (cluster -> train is the layering); this
// reader adds the slice checks and reads `cluster:` through its key table (cluster/recipe_keys.h), strictly:
// an unknown key there is most likely a typo.
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "train/recipe.h"

namespace olmosft::cluster {

// A GPU type the launcher knows (docs/k8s.md has the table): GKE's node label value, which is also the
// recipe's `cluster.accelerator`; the short model name of the gpu-<model>-NxG slice form; NVIDIA GPU Feature
// Discovery's `nvidia.com/gpu.product` value; the GPUs of the largest standard machine of that type (one
// pod per node takes them all); the memory of one GPU.
struct GpuType {
  std::string accelerator;  // nvidia-h200-141gb
  std::string model;        // h200
  std::string product;      // NVIDIA-H200
  int gpus_per_node = 0;    // 8
  int memory_gb = 0;        // 141 (GB as the product name says it)
  std::string machine;      // a3-ultragpu-8g (GKE machine type with gpus_per_node of them)
};
const std::vector<GpuType>& gpu_types();
// The type with this accelerator value (or, by_model, this short model name); throws olmosft::Error listing
// the known ones.
const GpuType& find_gpu_type(const std::string& name, bool by_model = false);

// A slice description: "tpu-<gen>-<topology>" (tpu-v4-4x4x8) or "gpu-<model>-<nodes>x<gpus>" (gpu-h100-2x8;
// also what cluster.accelerator + cluster.nodes make).
struct SliceSpec {
  enum class Kind { Tpu, Gpu };
  std::string text;
  Kind kind = Kind::Tpu;
  std::string generation;         // "v4", "h100", ...
  std::string topology;           // "4x4x8" (TPU only)
  int hosts = 0;                  // pods, one per host/node
  int devices_per_host = 0;       // TPU chips or GPUs per pod
  std::string accelerator_key;    // node label key for the accelerator type
  std::string accelerator_value;  // e.g. tpu-v4-podslice, nvidia-h100-80gb
  std::string resource_name;      // google.com/tpu or nvidia.com/gpu
  const GpuType* gpu = nullptr;   // GPU only: the type (gpu_types())
  bool multi_host_tpu() const { return kind == Kind::Tpu && hosts > 1; }
  int devices() const { return hosts * devices_per_host; }
};

// Parses a slice string; throws olmosft::Error naming the string and the accepted forms.
SliceSpec parse_slice(const std::string& text);
// `nodes` whole nodes of one GPU type (cluster.accelerator + cluster.nodes): gpu-<model>-<nodes>x<gpus>.
SliceSpec gpu_slice(const GpuType& type, int nodes);

// `k8s watch`'s stop rules. A default StopRules stops on a non-finite loss only; a recipe's come from its
// cluster.stop_rules.* keys (cluster/recipe_keys.h has their defaults and checks).
struct StopRules {
  bool nan_loss = true;                    // any non-finite LOSS-PARTS value
  std::optional<double> max_required_rbf;  // REQUIRED_RBF above this
  std::optional<double> stall_minutes;     // no new step for this long (after the first step)
};

// The recipe's `cluster:` section, typed: one field per cluster.* key (cluster/recipe_keys.h: the table of
// keys, their defaults, docs and checks; read_cluster fills every field, so none has a default of its own
// here), the slice made from cluster.slice or cluster.accelerator + cluster.nodes.
struct ClusterSpec {
  std::string namespace_;
  std::string queue;  // Kueue LocalQueue (label kueue.x-k8s.io/queue-name)
  std::string image;
  SliceSpec slice;
  bool host_network = false;
  std::string node_pool;           // empty: any
  std::string exclusive_topology;  // node label key; empty: none
  int max_restarts = 0;
  std::string service_account;
  std::string container;
  std::vector<std::string> command;
  int coordinator_port = 0;
  StopRules stop_rules;
  // GPU node selector: "gke" (cloud.google.com/gke-accelerator) or "nvidia" (nvidia.com/gpu.product, the
  // label NVIDIA's GPU Feature Discovery / GPU Operator sets on any cluster).
  std::string gpu_label;
  std::string nccl_socket_ifname;  // GPU: NCCL_SOCKET_IFNAME (the pod's interface)
  // This build trains on CPUs only: a slice whose accelerators it would leave idle (TPU; GPU with
  // device=cpu) is refused unless the recipe says so here.
  bool allow_cpu_on_accelerator_hosts = false;
};

struct Recipe {
  std::string origin;  // file path (for messages)
  std::string source_text;
  std::vector<std::string> overrides;
  YAML::Node root;  // effective recipe (overrides applied; devices set from the slice)

  // The trainer's typed view of the effective recipe, read with its own reader (src/train/recipe.h): run
  // name, batch arithmetic over the slice's devices (train.batch.slots rows per micro-step,
  // train.batch.grad_accum), checkpoint.grace_seconds, mesh, and the raw cluster section.
  TrainConfig train;
  ClusterSpec cluster;  // read from train.cluster

  std::string effective_yaml() const;  // the recipe after overrides, as YAML
};

// Applies "a.b.c=value" to a YAML tree (value parsed as a YAML scalar/flow node).
void apply_override(YAML::Node& root, const std::string& kv);

Recipe parse_recipe(const std::string& text, const std::string& origin,
                    const std::vector<std::string>& overrides);
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides);

// Throws unless the batch and mesh fit the slice: per_device_batch 1/k with k dividing the devices (or a
// whole number), the trainer's batch arithmetic over the slice's devices, the mesh covering them. Sets
// r.train.batch (devices and the derived numbers). Called by parse_recipe; exposed for tests.
void check_fits(Recipe& r);

// What this build's pods would really do on the slice, said plainly. Throws for accelerators they would leave
// idle (device=cpu, or device=xla on XLA's CPU plugin) unless cluster.allow_cpu_on_accelerator_hosts, for
// device=cuda on a TPU slice, for device=xla with the other accelerator's plugin or without dist.mode dp;
// returns the warning lines `k8s render`/`launch` print (and the JobSet carries): CPU training on accelerator
// hosts, device=cuda (refused by the pods at preflight), or device=xla (one device per pod, no multi-host
// job yet). Called by render(), not by parse_recipe (`k8s watch` reads the recipes of runs rendered before
// these rules).
std::vector<std::string> accelerator_warnings(const Recipe& r);

}  // namespace olmosft::cluster
