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
  EXPECT_NE(error_of([] { parse_slice("gpu-k80-1x8"); }).find("unknown GPU model 'k80'"), std::string::npos);
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
    EXPECT_EQ(e, "r.yaml: key 'cluster.slice': missing (required)");
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
