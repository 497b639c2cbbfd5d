// Recipe reader, slice catalogue, batch/mesh fit checks, and run names.
#include <gtest/gtest.h>

#include "cluster/manifest.h"
#include "cluster/recipe.h"
#include "core/error.h"

using namespace olmosft::cluster;

namespace {

const char* kBase = R"(run_name: test-run
model:
  init: /mnt/hf/base
data:
  path: /mnt/data/packed
seq_len: 65536
global_batch: 16
per_device_batch: 0.125
steps: 100
output_dir: /out
cluster:
  namespace: olmo
  queue: post-training
  image: example.com/olmosft:1
  slice: tpu-v4-4x4x8
  allow_cpu_on_accelerator_hosts: true
)";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const olmosft::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(K8sSlice, Catalogue) {
  SliceSpec v4 = parse_slice("tpu-v4-4x4x8");
  EXPECT_EQ(v4.hosts, 32);
  EXPECT_EQ(v4.devices_per_host, 4);
  EXPECT_EQ(v4.devices(), 128);
  EXPECT_EQ(v4.accelerator_value, "tpu-v4-podslice");
  EXPECT_EQ(v4.topology, "4x4x8");
  EXPECT_TRUE(v4.multi_host_tpu());
  SliceSpec v5e = parse_slice("tpu-v5e-2x4");
  EXPECT_EQ(v5e.hosts, 1);
  EXPECT_EQ(v5e.devices_per_host, 8);
  EXPECT_FALSE(v5e.multi_host_tpu());
  SliceSpec v6e = parse_slice("tpu-v6e-4x4");
  EXPECT_EQ(v6e.hosts, 4);
  EXPECT_EQ(v6e.accelerator_value, "tpu-v6e-slice");
  SliceSpec g = parse_slice("gpu-h100-2x8");
  EXPECT_EQ(g.hosts, 2);
  EXPECT_EQ(g.devices_per_host, 8);
  EXPECT_EQ(g.resource_name, "nvidia.com/gpu");
  EXPECT_EQ(g.accelerator_value, "nvidia-h100-80gb");
  EXPECT_EQ(parse_slice("gpu-h100-mega-1x8").accelerator_value, "nvidia-h100-mega-80gb");
  EXPECT_NE(error_of([] { parse_slice("tpu-v9-4x4x8"); }).find("unknown TPU generation 'v9'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_slice("tpu-v4-4x4"); }).find("needs 3 dimensions"), std::string::npos);
  EXPECT_NE(error_of([] { parse_slice("gpu-k80-1x8"); }).find("slice 'gpu-k80-1x8': unknown GPU model 'k80'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_slice("gpu-h100-2x16");
            }).find("16 GPUs per node, but a nvidia-h100-80gb node has 8 (a3-highgpu-8g)"),
            std::string::npos);
  EXPECT_EQ(parse_slice("gpu-l4-3x4").devices(), 12);  // part of a node: one pod per node all the same
  EXPECT_NE(error_of([] { parse_slice("v4-4x4x8"); }).find("expected 'tpu-"), std::string::npos);
  EXPECT_NE(error_of([] { parse_slice("tpu-v4-4xax8"); }).find("bad shape"), std::string::npos);
}

TEST(K8sRecipe, RunbookBatchFits) {
  Recipe r = parse_recipe(kBase, "r.yaml", {});
  // The trainer's typed view, over the slice's devices.
  EXPECT_EQ(r.train.batch.devices, 128);
  EXPECT_EQ(r.train.batch.tokens_per_step, 16 * 65536);
  EXPECT_EQ(r.train.run_name, "test-run");
  EXPECT_EQ(r.cluster.command, (std::vector<std::string>{"olmosft", "train", "/etc/olmosft/recipe.yaml"}));
  EXPECT_EQ(r.train.batch.slots, 16);  // 128 chips x 0.125
  EXPECT_EQ(r.train.batch.grad_accum, 1);
  EXPECT_TRUE(r.cluster.host_network);  // multi-host TPU default
  EXPECT_EQ(r.cluster.exclusive_topology, "cloud.google.com/gke-nodepool");
  EXPECT_TRUE(r.cluster.stop_rules.nan_loss);
  EXPECT_FALSE(r.cluster.stop_rules.stall_minutes.has_value());
  // Gradient accumulation: 32 = 2 x 16.
  Recipe r2 = parse_recipe(kBase, "r.yaml", {"global_batch=32"});
  EXPECT_EQ(r2.train.batch.grad_accum, 2);
}

TEST(K8sRecipe, RefusesBatchThatDoesNotFit) {
  std::string e = error_of([] { parse_recipe(kBase, "r.yaml", {"global_batch=20"}); });
  EXPECT_NE(e.find("r.yaml: batch does not fit slice tpu-v4-4x4x8 (32 hosts x 4 devices = 128 devices)"),
            std::string::npos)
      << e;
  // The batch arithmetic is the trainer's, over the slice's devices.
  EXPECT_NE(e.find("global_batch=20 is not divisible by devices x per_device_batch = 16"), std::string::npos)
      << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"per_device_batch=0.3"}); });
  EXPECT_NE(e.find("not 1/k"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"per_device_batch=1.5"}); });
  EXPECT_NE(e.find("above 1 must be an integer"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"per_device_batch=0.0078125"}); });  // 1/128: one row
  EXPECT_EQ(e, "");
  e = error_of(
      [] { parse_recipe(kBase, "r.yaml", {"per_device_batch=0.00390625"}); });  // 1/256 > 128 devices
  EXPECT_NE(e.find("puts one row on 256 devices, which does not divide 128"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"mesh={fsdp: 16, expert: 4}"}); });
  EXPECT_NE(e.find("mesh expert=4 x fsdp=16 covers 64 devices, but slice tpu-v4-4x4x8 has 128"),
            std::string::npos)
      << e;
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"mesh={fsdp: 16, expert: 8}"}); }), "");
  // GPU: 2 nodes x 8 GPUs x 2 rows = 32 rows per micro-step.
  Recipe g =
      parse_recipe(kBase, "r.yaml", {"cluster.slice=gpu-h100-2x8", "per_device_batch=2", "global_batch=64"});
  EXPECT_EQ(g.train.batch.slots, 32);
  EXPECT_EQ(g.train.batch.grad_accum, 2);
  EXPECT_FALSE(g.cluster.host_network);
  EXPECT_EQ(g.cluster.exclusive_topology, "");
}

TEST(K8sRecipe, OverridesAndValidation) {
  Recipe r =
      parse_recipe(kBase, "r.yaml",
                   {"steps=7", "cluster.stop_rules.nan_loss=false", "cluster.stop_rules.stall_minutes=2.5",
                    "checkpoint.grace_seconds=120", "optimizer.lr=1e-5"});
  EXPECT_EQ(r.train.batch.steps, 7);
  EXPECT_FALSE(r.cluster.stop_rules.nan_loss);
  EXPECT_DOUBLE_EQ(*r.cluster.stop_rules.stall_minutes, 2.5);
  EXPECT_EQ(r.train.checkpoint.grace_seconds, 120);
  EXPECT_DOUBLE_EQ(r.train.optimizer.lr, 1e-5);
  EXPECT_EQ(r.root["optimizer"]["lr"].Scalar(), "1e-5");  // trainer keys are kept for the trainer
  EXPECT_NE(r.effective_yaml().find("steps: 7"), std::string::npos);
  // The pod's trainer divides the batch by the slice's devices: set in the mounted recipe.
  EXPECT_NE(r.effective_yaml().find("devices: 128"), std::string::npos) << r.effective_yaml();

  std::string e = error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.qeue=x"}); });
  EXPECT_NE(e.find("r.yaml: key 'cluster.qeue': unknown key"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"steps=ten"}); });
  EXPECT_NE(e.find("r.yaml (as `olmosft train` reads it): key 'steps' expects an integer, got 'ten'"),
            std::string::npos)
      << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"steps"}); });
  EXPECT_NE(e.find("expected key=value"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.stop_rules.max_required_rbf=-1"}); });
  EXPECT_NE(e.find("max_required_rbf': must be > 0"), std::string::npos) << e;
  e = error_of([] { parse_recipe("run_name: x\n", "r.yaml", {}); });
  EXPECT_NE(e.find("key 'seq_len': missing (required)"), std::string::npos) << e;
  {  // a missing cluster.slice is reported once (issue #17: the key was named twice)
    std::string base = kBase;
    base.erase(base.find("  slice: tpu-v4-4x4x8\n"), std::string("  slice: tpu-v4-4x4x8\n").size());
    e = error_of([&] { parse_recipe(base, "r.yaml", {}); });
    EXPECT_EQ(e,
              "r.yaml: key 'cluster.slice': missing (required: cluster.slice for a TPU slice, or "
              "cluster.accelerator for GPU nodes)");
  }
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.namespace=Olmo_NS"}); });
  EXPECT_NE(e.find("not a valid namespace name"), std::string::npos) << e;
  e = error_of([] { parse_recipe("a: [", "bad.yaml", {}); });
  EXPECT_NE(e.find("bad.yaml: not valid YAML"), std::string::npos) << e;
  // Trainer keys are checked with the trainer's reader at launch time, not in the pod.
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"optimizer.lr_warmup=0.1"}); });
  EXPECT_NE(e.find("r.yaml (as `olmosft train` reads it): unknown recipe key 'optimizer.lr_warmup'"),
            std::string::npos)
      << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"optimizer.lr=fast"}); });
  EXPECT_NE(e.find("optimizer.lr"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"devices=64"}); });
  EXPECT_NE(e.find("key 'devices': 64 but slice tpu-v4-4x4x8 has 128 devices"), std::string::npos) << e;
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"devices=128"}); }), "");
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.stop_rules.nan_los=false"}); });
  EXPECT_NE(
      e.find("r.yaml: key 'cluster.stop_rules.nan_los': unknown key (allowed under 'cluster.stop_rules'"),
      std::string::npos)
      << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.queue={a: b}"}); });
  EXPECT_NE(e.find("key 'cluster.queue': expected a single value"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.max_restarts=many"}); });
  EXPECT_NE(e.find("key 'cluster.max_restarts': expected an integer, got 'many'"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.command=olmosft"}); });
  EXPECT_NE(e.find("key 'cluster.command': expected a non-empty list"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"mesh={fsdp: 0}"}); });
  EXPECT_NE(e.find("key 'mesh.fsdp' expects an integer >= 1"), std::string::npos) << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"steps.x=1"}); });
  EXPECT_NE(e.find("'steps' is not a map"), std::string::npos) << e;
}

TEST(K8sNames, Dns1035AndLength) {
  std::string n = make_jobset_name("Olmo35 SFT_h045/TPU full run r2", "abc123", "slice", 1, 32);
  EXPECT_EQ(n, "olmo35-sft-h045-tpu-full-run-r2-abc123");
  EXPECT_TRUE(is_dns1035_label(n));
  std::string long_name(200, 'x');
  n = make_jobset_name("9" + long_name, "ff00aa", "slice", 1, 256);
  EXPECT_TRUE(is_dns1035_label(n)) << n;
  EXPECT_EQ(n.front(), 'r');  // must start with a letter
  // Longest pod hostname <name>-slice-0-255 fits in 63 characters exactly.
  EXPECT_EQ(n.size() + std::string("-slice-0-255").size(), 63u) << n;
  EXPECT_FALSE(is_dns1035_label("Abc"));
  EXPECT_FALSE(is_dns1035_label("abc-"));
  EXPECT_FALSE(is_dns1035_label("1abc"));
  EXPECT_NE(error_of([] { make_jobset_name("x", "ABC", "slice", 1, 4); }).find("lowercase"),
            std::string::npos);
}

// Issue #15: GPU nodes by accelerator type. The table's numbers are the launcher's (docs/k8s.md); an
// unknown type is refused listing the known ones.
TEST(K8sGpu, AcceleratorTable) {
  const GpuType& h200 = find_gpu_type("nvidia-h200-141gb");
  EXPECT_EQ(h200.gpus_per_node, 8);
  EXPECT_EQ(h200.memory_gb, 141);
  EXPECT_EQ(h200.product, "NVIDIA-H200");
  EXPECT_EQ(h200.machine, "a3-ultragpu-8g");
  const GpuType& h100 = find_gpu_type("nvidia-h100-80gb");
  EXPECT_EQ(h100.gpus_per_node, 8);
  EXPECT_EQ(h100.memory_gb, 80);
  EXPECT_EQ(h100.product, "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(&find_gpu_type("h200", /*by_model=*/true), &h200);
  EXPECT_EQ(gpu_types().size(), 7u);
  for (const auto& t : gpu_types()) {  // every row complete; the short form round-trips
    EXPECT_GT(t.gpus_per_node, 0) << t.accelerator;
    EXPECT_GT(t.memory_gb, 0) << t.accelerator;
    EXPECT_EQ(t.product.rfind("NVIDIA-", 0), 0u) << t.accelerator;
    EXPECT_EQ(parse_slice("gpu-" + t.model + "-2x" + std::to_string(t.gpus_per_node)).gpu, &t);
  }
  SliceSpec s = gpu_slice(h200, 3);
  EXPECT_EQ(s.text, "gpu-h200-3x8");
  EXPECT_EQ(s.hosts, 3);
  EXPECT_EQ(s.devices(), 24);
  EXPECT_EQ(s.accelerator_key, "cloud.google.com/gke-accelerator");
  EXPECT_EQ(s.accelerator_value, "nvidia-h200-141gb");
  EXPECT_EQ(s.resource_name, "nvidia.com/gpu");
  std::string e = error_of([] { find_gpu_type("nvidia-k80"); });
  EXPECT_EQ(
      e,
      "unknown GPU accelerator 'nvidia-k80' (known: nvidia-tesla-a100, nvidia-a100-80gb, nvidia-h100-80gb, "
      "nvidia-h100-mega-80gb, nvidia-h200-141gb, nvidia-b200, nvidia-l4)");
}

TEST(K8sGpu, AcceleratorKeysAndDeviceHonesty) {
  // 2 H200 nodes x 8 GPUs x 1 row = 16 rows per micro-step, device=cuda: rendered, with a warning.
  const std::vector<std::string> gpu = {"cluster.slice=",
                                        "cluster.allow_cpu_on_accelerator_hosts=false",
                                        "cluster.accelerator=nvidia-h200-141gb",
                                        "cluster.nodes=2",
                                        "per_device_batch=1",
                                        "device=cuda"};
  Recipe r = parse_recipe(kBase, "r.yaml", gpu);
  EXPECT_EQ(r.cluster.slice.text, "gpu-h200-2x8");
  EXPECT_EQ(r.train.batch.devices, 16);
  EXPECT_EQ(r.train.batch.slots, 16);
  EXPECT_EQ(r.train.device, "cuda");
  EXPECT_EQ(r.cluster.gpu_label, "gke");
  EXPECT_EQ(r.cluster.nccl_socket_ifname, "eth0");
  EXPECT_FALSE(r.cluster.host_network);
  const std::vector<std::string> w = accelerator_warnings(r);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].rfind("WARNING: device=cuda: olmosft has no hand-written CUDA backend (GPUs train with "
                       "device: xla and xla.plugin: cuda). These manifests are the GPU JobSet for the "
                       "16 GPUs of gpu-h200-2x8 (2 pods)",
                       0),
            0u)
      << w[0];
  EXPECT_NE(w[0].find("every pod would fail at preflight"), std::string::npos);
  // The generic node label instead of GKE's.
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> ov = gpu;
    ov.insert(ov.end(), extra.begin(), extra.end());
    return ov;
  };
  Recipe n =
      parse_recipe(kBase, "r.yaml", with({"cluster.gpu_label=nvidia", "cluster.nccl_socket_ifname=^lo"}));
  EXPECT_EQ(n.cluster.slice.accelerator_key, "nvidia.com/gpu.product");
  EXPECT_EQ(n.cluster.slice.accelerator_value, "NVIDIA-H200");
  EXPECT_EQ(n.cluster.nccl_socket_ifname, "^lo");
  // device=cpu on GPU nodes: refused unless asked for, then rendered with a loud line.
  std::string e =
      error_of([&] { accelerator_warnings(parse_recipe(kBase, "r.yaml", with({"device=cpu"}))); });
  EXPECT_EQ(
      e.rfind("r.yaml: key 'cluster.accelerator': gpu-h200-2x8 (16 GPUs, 2 pods): device=cpu would train on "
              "the hosts' CPUs and leave the accelerators idle. Set device: xla with xla.plugin: cuda to "
              "train on them (xla.devices of them per pod), or cluster.allow_cpu_on_accelerator_hosts=true",
              0),
      0u)
      << e;
  Recipe c =
      parse_recipe(kBase, "r.yaml", with({"device=cpu", "cluster.allow_cpu_on_accelerator_hosts=true"}));
  ASSERT_EQ(accelerator_warnings(c).size(), 1u);
  EXPECT_EQ(accelerator_warnings(c)[0].rfind("WARNING: CPU TRAINING ON ACCELERATOR HOSTS:", 0), 0u);
  // Bad values name the key.
  e = error_of([&] { parse_recipe(kBase, "r.yaml", with({"cluster.accelerator=nvidia-k80"})); });
  EXPECT_NE(e.find("r.yaml: key 'cluster.accelerator': unknown GPU accelerator 'nvidia-k80' (known: "),
            std::string::npos)
      << e;
  e = error_of([&] { parse_recipe(kBase, "r.yaml", with({"cluster.nodes=0"})); });
  EXPECT_NE(e.find("key 'cluster.nodes': 0 is out of range [1, 4096]"), std::string::npos) << e;
  e = error_of([&] { parse_recipe(kBase, "r.yaml", with({"cluster.gpu_label=aks"})); });
  EXPECT_NE(e.find("key 'cluster.gpu_label': expected gke (cloud.google.com/gke-accelerator) or nvidia"),
            std::string::npos)
      << e;
  e = error_of([&] { parse_recipe(kBase, "r.yaml", with({"cluster.nccl_socket_ifname=eth0 eth1"})); });
  EXPECT_NE(e.find("key 'cluster.nccl_socket_ifname': expected an interface name"), std::string::npos) << e;
  e = error_of([&] { parse_recipe(kBase, "r.yaml", with({"cluster.slice=tpu-v4-2x2x4"})); });
  EXPECT_NE(e.find("key 'cluster.accelerator': give cluster.slice (a TPU slice) or cluster.accelerator (GPU "
                   "nodes), not both"),
            std::string::npos)
      << e;
  e = error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.nodes=2"}); });
  EXPECT_NE(e.find("key 'cluster.nodes': only with cluster.accelerator"), std::string::npos) << e;
  e = error_of(
      [&] { parse_recipe(kBase, "r.yaml", with({"cluster.allow_cpu_on_accelerator_hosts=maybe"})); });
  EXPECT_NE(e.find("key 'cluster.allow_cpu_on_accelerator_hosts': expected true or false"), std::string::npos)
      << e;
}

// Issue #15 item 5: this build cannot use a TPU. A TPU slice is refused unless the recipe accepts CPU
// training on the TPU hosts, and then every render says so; device=cuda on a TPU slice is refused outright.
// device=xla with the slice's plugin trains on its accelerators, one device per pod for now (docs/xla.md):
// rendered with a warning that says so, without cluster.allow_cpu_on_accelerator_hosts.
TEST(K8sGpu, XlaOnAcceleratorsSaysWhatEachPodUses) {
  const std::vector<std::string> tpu = {"cluster.allow_cpu_on_accelerator_hosts=false", "device=xla",
                                        "xla.plugin=tpu"};
  std::vector<std::string> w = accelerator_warnings(parse_recipe(kBase, "r.yaml", tpu));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0],
            "WARNING: device=xla on the 128 TPU chips of tpu-v4-4x4x8 (32 pods): each pod runs one olmosft "
            "process on 1 of its host's 4 TPU chips (xla.devices: one data-parallel SPMD program, parameters "
            "replicated, docs/xla.md), so 3 of them stay idle; the pods do not form one training job yet (no "
            "multi-host launcher).");
  auto with = [](std::vector<std::string> ov, std::vector<std::string> extra) {
    ov.insert(ov.end(), extra.begin(), extra.end());
    return ov;
  };
  // A plugin path is taken as the slice's own; one GPU node has no multi-host clause.
  EXPECT_EQ(accelerator_warnings(parse_recipe(kBase, "r.yaml", with(tpu, {"xla.plugin=/opt/tpu/libtpu.so"}))),
            w);
  const std::vector<std::string> gpu = {"cluster.slice=",
                                        "cluster.allow_cpu_on_accelerator_hosts=false",
                                        "cluster.accelerator=nvidia-h200-141gb",
                                        "cluster.nodes=1",
                                        "per_device_batch=1",
                                        "global_batch=8",
                                        "device=xla",
                                        "xla.plugin=cuda"};
  w = accelerator_warnings(parse_recipe(kBase, "r.yaml", gpu));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(
      w[0],
      "WARNING: device=xla on the 8 GPUs of gpu-h200-1x8 (1 pods): each pod runs one olmosft process on "
      "1 of its host's 8 GPUs (xla.devices: one data-parallel SPMD program, parameters replicated, "
      "docs/xla.md), so 7 of them stay idle.");
  // A mesh over the one host's 8 GPUs runs as one process: no warning; the same mesh spread over two hosts
  // says that this build runs a mesh inside one process.
  EXPECT_TRUE(accelerator_warnings(parse_recipe(kBase, "r.yaml", with(gpu, {"mesh={fsdp: 8}"}))).empty());
  w = accelerator_warnings(parse_recipe(
      kBase, "r.yaml", with(gpu, {"cluster.nodes=2", "global_batch=16", "mesh={fsdp: 2, expert: 8}"})));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0],
            "WARNING: device=xla on the 16 GPUs of gpu-h200-2x8 (2 pods): the mesh (data=1 fsdp=2 expert=8 "
            "context=1) is one SPMD program over 16 GPUs on 2 hosts, and this build runs a mesh inside one "
            "process only (the multi-host runtime, one client over every host's devices each process feeding "
            "its own, is not written yet): each pod's olmosft train refuses when it builds the model, its "
            "client addressing the 8 GPUs of its own host. `olmosft plan --compile` checks the program for "
            "the slice.");
  // xla.devices: all of a host's devices in one program; more than a host has is refused.
  w = accelerator_warnings(parse_recipe(kBase, "r.yaml", with(gpu, {"xla.devices=8"})));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].find("stay idle"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("on 8 of its host's 8 GPUs"), std::string::npos) << w[0];
  w = accelerator_warnings(
      parse_recipe(kBase, "r.yaml", with(gpu, {"xla.devices=8", "xla.shard_params=true"})));
  EXPECT_NE(w.at(0).find("one data-parallel SPMD program, parameters split over them"), std::string::npos)
      << w[0];
  EXPECT_EQ(
      error_of([&] { accelerator_warnings(parse_recipe(kBase, "r.yaml", with(gpu, {"xla.devices=16"}))); }),
      "r.yaml: key 'xla.devices': 16 but the pods of gpu-h200-1x8 have 8 GPUs each");
  // The other accelerator's plugin, a sharded dist.mode, and XLA's CPU plugin are refused, naming the key.
  std::string e =
      error_of([&] { accelerator_warnings(parse_recipe(kBase, "r.yaml", with(tpu, {"xla.plugin=cuda"}))); });
  EXPECT_EQ(e, "r.yaml: key 'xla.plugin': cuda on TPU slice tpu-v4-4x4x8 (TPU chips need xla.plugin: tpu)");
  e = error_of([&] { accelerator_warnings(parse_recipe(kBase, "r.yaml", with(gpu, {"xla.plugin=tpu"}))); });
  EXPECT_EQ(e, "r.yaml: key 'xla.plugin': tpu on GPU nodes gpu-h200-1x8 (NVIDIA GPUs need xla.plugin: cuda)");
  e = error_of([&] { accelerator_warnings(parse_recipe(kBase, "r.yaml", with(tpu, {"dist.mode=zero3"}))); });
  EXPECT_EQ(
      e.rfind("r.yaml: key 'dist.mode': zero3 with device=xla (the XLA backend holds every parameter", 0), 0u)
      << e;
  e = error_of([&] { accelerator_warnings(parse_recipe(kBase, "r.yaml", with(tpu, {"xla.plugin=cpu"}))); });
  EXPECT_EQ(e.rfind("r.yaml: key 'cluster.slice': tpu-v4-4x4x8 (128 TPU chips, 32 pods): device=xla with "
                    "xla.plugin=cpu would train on the hosts' CPUs and leave the accelerators idle",
                    0),
            0u)
      << e;
  EXPECT_EQ(render(parse_recipe(kBase, "r.yaml", tpu), {"x"}).warnings[0].rfind("WARNING: device=xla on", 0),
            0u);
}

TEST(K8sGpu, TpuSliceIsHonest) {
  std::string e = error_of([] {
    accelerator_warnings(parse_recipe(kBase, "r.yaml", {"cluster.allow_cpu_on_accelerator_hosts=false"}));
  });
  EXPECT_EQ(
      e,
      "r.yaml: key 'cluster.slice': tpu-v4-4x4x8 (128 TPU chips, 32 pods): device=cpu would train on "
      "the hosts' CPUs and leave the accelerators idle. Set device: xla with xla.plugin: tpu to train "
      "on them (xla.devices of them per pod), or cluster.allow_cpu_on_accelerator_hosts=true to render it "
      "anyway");
  Recipe r = parse_recipe(kBase, "r.yaml", {});
  ASSERT_EQ(accelerator_warnings(r).size(), 1u);
  EXPECT_EQ(accelerator_warnings(r)[0],
            "WARNING: CPU TRAINING ON ACCELERATOR HOSTS: device=cpu: the 128 TPU chips of "
            "tpu-v4-4x4x8 (32 pods) stay idle and every pod trains on its host's CPUs "
            "(cluster.allow_cpu_on_accelerator_hosts=true).");
  e = error_of([] { accelerator_warnings(parse_recipe(kBase, "r.yaml", {"device=cuda"})); });
  EXPECT_EQ(e,
            "r.yaml: key 'device': cuda on TPU slice tpu-v4-4x4x8 (device=cuda needs NVIDIA GPU nodes: "
            "cluster.accelerator)");
  // render() refuses with the same message; the recipe itself still parses, so `k8s watch` can read the stop
  // rules of a run rendered before these rules (its ConfigMap has no allow_cpu_on_accelerator_hosts).
  Recipe old = parse_recipe(kBase, "r.yaml", {"cluster.allow_cpu_on_accelerator_hosts=false"});
  EXPECT_TRUE(old.cluster.stop_rules.nan_loss);
  EXPECT_NE(error_of([&] { render(old, {"x"}); }).find("device=cpu would train on the hosts' CPUs"),
            std::string::npos);
  EXPECT_EQ(render(r, {"x"}).warnings, accelerator_warnings(r));
}
