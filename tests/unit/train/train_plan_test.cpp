// The memory and compute plan (train/plan.h): the parts add up and follow their formulas, the activation
// parts equal what the models' workspaces really allocate for the tiny configs (Olmo3::workspace_bytes,
// Decoder::last_run after a forward_backward), the MoE caches equal the kernel's, a refused plan names
// a change that fits (and the change's plan does), and bad input (unknown device, impossible mesh) is an
// error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/moe.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/params.h"
#include "model/unit.h"
#include "train/batch.h"
#include "train/compiled_plan.h"
#include "train/plan.h"

using namespace olmosft;
using namespace olmosft::train;

namespace {

model::ModelConfig preset(const std::string& name) {
  return model::parse_config(model::preset_config_json(name), name);
}

const char* kRecipe = R"(run_name: t
seq_len: 64
global_batch: 2
devices: 1
per_device_batch: 2
steps: 1
)";

TrainConfig recipe(const std::vector<std::string>& overrides = {}) {
  return Recipe::parse(kRecipe, "plan-test.yaml", overrides).config();
}

PlanOptions on(const std::string& device, int64_t local = 1) {
  PlanOptions o;
  o.device = parse_device(device, local, "--device");
  o.threads = 2;
  return o;
}

// Independent of plan.cpp: the largest residency group (model/unit.h) and the largest tensor, in elements.
int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}
int64_t largest_unit(const model::ModelConfig& m) {
  const auto reg = model::param_registry(m);
  const std::vector<int> grp = model::unit::residency_groups(m);
  std::map<int, int64_t> sum;
  for (size_t i = 0; i < reg.size(); ++i) sum[grp[i]] += numel(reg[i].shape);
  int64_t best = 0;
  for (const auto& [g, n] : sum) best = std::max(best, n);
  return best;
}
int64_t largest_tensor(const model::ModelConfig& m) {
  int64_t best = 0;
  for (const auto& spec : model::param_registry(m)) best = std::max(best, numel(spec.shape));
  return best;
}

double part(const MemoryPlan& p, const std::string& name) {
  for (const PlanPart& x : p.parts)
    if (x.name == name) return x.bytes;
  ADD_FAILURE() << "no part '" << name << "'";
  return -1;
}

// One packed batch of B rows of T tokens: two documents per row, every target trained.
struct Rows {
  int64_t B, T;
  std::vector<int32_t> tokens, segments, positions, targets;
  std::vector<uint8_t> trained;
  Rows(int64_t b, int64_t t, int64_t vocab) : B(b), T(t) {
    for (int64_t i = 0; i < B * T; ++i) {
      const int64_t p = i % T;
      tokens.push_back(int32_t((i * 7 + 3) % vocab));
      segments.push_back(p < T / 2 ? 0 : 1);
      positions.push_back(int32_t(p < T / 2 ? p : p - T / 2));
      targets.push_back(int32_t((i * 5 + 1) % vocab));
      trained.push_back(1);
    }
  }
  model::Batch view() const { return batch_view(B, T, tokens, segments, positions, targets, trained); }
};

// The step peak's rule: every part held through the step plus the largest transient one.
double held_plus_largest_transient(const MemoryPlan& p) {
  double held = 0, transient = 0;
  for (const PlanPart& x : p.parts) {
    if (x.transient)
      transient = std::max(transient, x.bytes);
    else
      held += x.bytes;
  }
  return held + transient;
}

}  // namespace

TEST(TrainPlan, PartsAddUpAndFollowTheirFormulas) {
  const model::ModelConfig m = preset("olmo3-small");
  const int64_t P = model::count_params(m).total;
  for (const char* mode : {"dp", "zero3"}) {
    const TrainConfig cfg = recipe({std::string("dist.mode=") + mode, "devices=2", "global_batch=4"});
    const MemoryPlan p = plan_memory(m, cfg, on("cpu-64gib"));
    EXPECT_DOUBLE_EQ(p.step_peak, held_plus_largest_transient(p));
    const bool z = std::string(mode) == "zero3";
    const double shard = z ? 2.0 : 1.0;
    EXPECT_EQ(p.params, P);
    EXPECT_DOUBLE_EQ(part(p, "weights: fp32 master"), 4.0 * double(P) / shard);
    EXPECT_DOUBLE_EQ(part(p, "AdamW moments"), 8.0 * double(P) / shard);
    EXPECT_DOUBLE_EQ(part(p, "gradients"), z ? gradient_bytes(P, 2, true, largest_unit(m)) : 8.0 * double(P));
    EXPECT_GT(part(p, "communication buffers"), 0);
    EXPECT_DOUBLE_EQ(p.load_peak, load_bytes(P, z ? 2 : 1, largest_tensor(m)) + part(p, "runtime"));
    EXPECT_DOUBLE_EQ(p.budget, 0.9 * 64.0 * 1024 * 1024 * 1024);
    EXPECT_TRUE(p.fits);
    EXPECT_GT(p.flops_per_step, 0);
  }
  // The hybrid has two transient parts (MoE dispatch, CE tiles).
  const MemoryPlan h = plan_memory(preset("olmo3moe-tiny"), recipe({"seq_len=512"}), on("cpu-64gib"));
  int transients = 0;
  for (const PlanPart& x : h.parts) transients += x.transient ? 1 : 0;
  EXPECT_EQ(transients, 2);
  EXPECT_DOUBLE_EQ(h.step_peak, held_plus_largest_transient(h));
  // the dense layers' SwiGLU scratch is in the planned block (Block::Scratch), not a part of its own
  for (const PlanPart& x : h.parts) EXPECT_NE(x.name, "dense MLP backward");
  // On CPU the compute copy is the fp32 master itself (dp: nothing more); on a GPU it is a bf16 copy.
  const TrainConfig dp = recipe({"dist.mode=dp"});
  EXPECT_EQ(part(plan_memory(m, dp, on("cpu-64gib")), "weights: compute copy"), 0.0);
  // compute.dtype=bf16 on CPU: the matrices' bf16 copies (Bf16Weights), 2 bytes per parameter at most (dp),
  // the gathered unit's under zero3; no such part in fp32.
  const char* copies = "weights: bf16 copies (compute.dtype=bf16)";
  EXPECT_DOUBLE_EQ(
      part(plan_memory(m, recipe({"dist.mode=dp", "compute.dtype=bf16"}), on("cpu-64gib")), copies),
      2.0 * double(P));
  const double z3 =
      part(plan_memory(m, recipe({"dist.mode=zero3", "compute.dtype=bf16"}), on("cpu-64gib")), copies);
  EXPECT_GE(z3, 2.0 * double(largest_unit(m)));
  EXPECT_LT(z3, 2.0 * double(P));
  for (const PlanPart& x : plan_memory(m, dp, on("cpu-64gib")).parts) EXPECT_NE(x.name, copies);
  const MemoryPlan g = plan_memory(m, dp, on("h100-80gb"));
  EXPECT_DOUBLE_EQ(part(g, "weights: compute copy"), 2.0 * double(P));
  EXPECT_EQ(g.load_peak, 0.0);  // loading happens in host memory
  // 2 x 16 rows... time per step = FLOPs / (devices x peak x MFU).
  EXPECT_NEAR(g.seconds_per_step, g.flops_per_step / (989e12 * 0.4), 1e-12);
  // ZeRO-3 gradients: the 1/N shard + one unit's full-size pages (per-unit reduce-scatter); dp 2 x 4P.
  EXPECT_DOUBLE_EQ(gradient_bytes(1000, 4, true, 100), 1000.0 + 400.0);
  EXPECT_DOUBLE_EQ(gradient_bytes(1000, 4, false, 100), 8000.0);
  // Loading: 16P / shard + one fp32 tensor.
  EXPECT_DOUBLE_EQ(load_bytes(1000, 4, 100), 4000.0 + 400.0);
}

TEST(TrainPlan, DenseActivationsEqualTheModelsWorkspace) {
  const model::ModelConfig m = preset("olmo3-tiny");
  model::Decoder net(m);
  const Rows rows(2, 64, m.vocab_size);
  model::LossConfig lc;
  (void)net.forward_backward(rows.view(), lc, 1.0 / 128, 1.0);
  const TrainConfig cfg = recipe();
  const MemoryPlan p = plan_memory(m, cfg, on("cpu-64gib"));
  const double act = part(p, "saved activations") + part(p, "working set") + part(p, "attention workspace");
  EXPECT_EQ(act, double(net.workspace_bytes()));
}

TEST(TrainPlan, HybridActivationsAndMoeCachesEqualTheModelsWorkspace) {
  const model::ModelConfig m = preset("olmo3moe-tiny");
  model::Decoder net(m);
  model::init_params(net.params(), m, 1);
  const Rows rows(2, 64, m.vocab_size);
  model::LossConfig lc;
  (void)net.forward_backward(rows.view(), lc, 1.0 / 128, 1.0);
  const model::DecoderRunInfo& info = net.last_run();
  const TrainConfig cfg = recipe();
  const MemoryPlan p = plan_memory(m, cfg, on("cpu-64gib"));
  EXPECT_EQ(part(p, "saved activations") + part(p, "working set"), double(info.workspace_bytes));
  // The model's saved bytes include every MoE layer's dispatch cache, which the plan counts separately.
  EXPECT_EQ(part(p, "saved activations") + part(p, "MoE dispatch caches"), double(info.saved_bytes));
  EXPECT_GT(part(p, "MoE dispatch buffers"), 0);
  EXPECT_GT(part(p, "cross-entropy tiles"), 0);
}

TEST(TrainPlan, RefusedPlanNamesTheFirstChangeThatFits) {
  const model::ModelConfig m = preset("olmo3-small");
  // 4 rows of 1,024 tokens per process do not fit 0.5 GiB; more processes (zero3) with fewer rows do.
  const TrainConfig cfg = recipe({"seq_len=1024", "global_batch=8", "per_device_batch=4", "dist.mode=dp"});
  const PlanOptions o = on("cpu-0.5gib");
  const MemoryPlan p = make_plan(m, cfg, o);
  ASSERT_FALSE(p.fits);
  ASSERT_FALSE(p.change.empty()) << p.change_note;
  EXPECT_NE(p.change.find("dist.mode=zero3"), std::string::npos) << p.change;
  std::vector<std::string> ov = {"seq_len=1024", "global_batch=8", "per_device_batch=4"};
  for (size_t b = 0, e; b < p.change.size(); b = e + 1) {
    e = p.change.find(' ', b);
    if (e == std::string::npos) e = p.change.size();
    ov.push_back(p.change.substr(b, e - b));
  }
  EXPECT_TRUE(plan_memory(m, recipe(ov), o).fits) << p.change;
  const std::string r = refusal(p);
  EXPECT_NE(r.find("DOES NOT FIT"), std::string::npos);
  EXPECT_NE(r.find("smallest change that fits: " + p.change), std::string::npos) << r;
  const std::string text = format_plan(p);
  EXPECT_NE(text.find("PLAN fits=no"), std::string::npos);
  for (const PlanPart& x : p.parts) EXPECT_NE(text.find(x.name), std::string::npos) << x.name;
  // Nothing fits 10 MiB: the note says so and names the minimum.
  const MemoryPlan none = make_plan(m, cfg, on("cpu-0.01gib"));
  EXPECT_FALSE(none.fits);
  EXPECT_TRUE(none.change.empty());
  EXPECT_NE(none.change_note.find("no change fits"), std::string::npos) << none.change_note;
  // The trainer's preflight refuses with that message (the 7B at 65,536 tokens fits no CPU process).
  const TrainConfig big = recipe({"seq_len=65536", "global_batch=1", "per_device_batch=1"});
  try {
    require_fit(preset("olmo3-7b"), big, 1);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DOES NOT FIT"), std::string::npos) << e.what();
  }
  // device: xla on an accelerator: the host holds only the fp32 master, gradients and moments (the step's
  // activations are on the device): a small model whose 64 rows of 65,536 tokens fit no CPU fits the host.
  const std::vector<std::string> wide = {"seq_len=65536", "global_batch=64", "per_device_batch=64"};
  EXPECT_THROW(require_fit(preset("olmo3-small"), recipe(wide), 1), Error);
  std::vector<std::string> xla = wide;
  xla.insert(xla.end(), {"device=xla", "xla.plugin=cpu"});
  EXPECT_THROW(require_fit(preset("olmo3-small"), recipe(xla), 1), Error) << "XLA's CPU plugin: host memory";
  xla.back() = "xla.plugin=cuda";
  const MemoryPlan host = require_fit(preset("olmo3-small"), recipe(xla), 1);
  EXPECT_TRUE(host.fits);
  std::vector<std::string> names;
  double sum = 0;
  for (const PlanPart& x : host.parts) names.push_back(x.name), sum += x.bytes;
  EXPECT_EQ(names,
            (std::vector<std::string>{"weights: fp32 master", "gradients", "AdamW moments", "runtime"}));
  EXPECT_DOUBLE_EQ(host.step_peak, sum);
  EXPECT_GE(sum, 16.0 * double(host.params));  // 4 (master) + 4 (gradients, at least) + 8 (moments)
}

TEST(TrainPlan, BadInputIsAnError) {
  const model::ModelConfig m = preset("olmo3-tiny");
  auto msg = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg([] { parse_device("h100", 1, "--device"); }).find("unknown device 'h100'"),
            std::string::npos);
  EXPECT_NE(msg([] { parse_device("h100", 1, "--device"); }).find("h200-141gb"), std::string::npos);
  EXPECT_NE(msg([] { parse_device("cpu-xgib", 1, "--device"); }).find("cpu-<N>gib"), std::string::npos);
  EXPECT_NE(msg([] { parse_device("cpu--1gib", 1, "--device"); }).find("N > 0"), std::string::npos);
  EXPECT_DOUBLE_EQ(parse_device("tpu-v4", 1, "x").memory, 32.0 * 1024 * 1024 * 1024);
  EXPECT_GT(parse_device("cpu", 1, "x").memory, 2 * parse_device("cpu", 3, "x").memory * 1.4);
  // Fractional rows on a CPU process; a row split over a fractional number of accelerators.
  const TrainConfig frac = recipe({"devices=4", "per_device_batch=0.5"});
  EXPECT_NE(msg([&] { plan_memory(m, frac, on("cpu-8gib")); }).find("whole rows"), std::string::npos);
  EXPECT_TRUE(plan_memory(m, frac, on("tpu-v4")).fits);  // a row over 2 chips
  const TrainConfig odd = recipe({"devices=10", "global_batch=3", "per_device_batch=0.3"});
  EXPECT_NE(msg([&] { plan_memory(m, odd, on("tpu-v4")); }).find("not a whole number"), std::string::npos);
  // The mesh itself: devices x per_device_batch must divide global_batch (derive_batch).
  EXPECT_NE(msg([] { recipe({"devices=3"}); }).find("global_batch"), std::string::npos);
  PlanOptions bad = on("cpu-8gib");
  bad.mfu = 0;
  EXPECT_NE(msg([&] { plan_memory(m, recipe(), bad); }).find("mfu"), std::string::npos);
}

TEST(TrainPlan, MoeWorkspaceBoundsFollowTheBufferFactor) {
  moe::MoeDims d{.d = 64, .experts = 8, .top_k = 2, .expert_hidden = 32, .latent = 16, .shared_hidden = 64};
  const moe::MoeWorkspace dropless = moe::moe_workspace_bytes(d, 1000, 2);
  d.buffer_factor = 1.0;
  const moe::MoeWorkspace capped = moe::moe_workspace_bytes(d, 1000, 2);
  EXPECT_EQ(dropless.cache, capped.cache);
  EXPECT_GT(dropless.transient(), capped.transient());
  // Dropless, one expert at a time: the scratch holds at most N rows (6F + 4Lt floats each in the backward).
  d.buffer_factor = -1;
  const moe::MoeWorkspace one = moe::moe_workspace_bytes(d, 1000, 1);
  EXPECT_GE(one.backward, size_t(1000) * (6 * 32 + 4 * 16) * 4);
}

// The preset a model directory's name matches when model.init cannot be read here (olmosft plan of the
// runbook's recipes on a machine without the cluster's volume), and the compiled plan's greppable line.
TEST(TrainPlan, ModelDirectoryNamesMatchTheirPresetAndTheCompiledLineReads) {
  using olmosft::train::preset_for_model_name;
  EXPECT_EQ(preset_for_model_name("/mnt/post-training/hf/olmo35-small-4t-emo"), "olmo3moe-small");
  EXPECT_EQ(preset_for_model_name("/mnt/post-training/hf/Olmo-3-1025-7B/"), "olmo3-7b");
  EXPECT_EQ(preset_for_model_name("/x/OLMo-Hybrid-7B"), "olmo-hybrid-7b");
  EXPECT_EQ(preset_for_model_name("/x/olmo3-moe-7b"), "");  // a 7B MoE is no preset of ours
  EXPECT_EQ(preset_for_model_name("/x/llama-7b"), "");
  olmosft::train::CompiledPlan p;
  p.topology = "tpu-v4:2x2x1";
  p.devices = 4;
  p.mesh.fsdp = 4;
  p.B = 4, p.T = 1024, p.temp_bytes = 100, p.step_bytes = 300, p.moments_bytes = 20, p.need_bytes = 320;
  p.device_bytes = 1000, p.fits = true, p.compile_s = 1.5;
  EXPECT_EQ(
      olmosft::train::compiled_plan_line(p, 280),
      "PLAN compiled=yes topology=tpu-v4:2x2x1 devices=4 mesh=data=1,fsdp=4,expert=1,context=1 B=4 T=1024 "
      "argument_bytes=0 output_bytes=0 alias_bytes=0 temp_bytes=100 code_bytes=0 step_bytes=300 "
      "moments_bytes=20 sums_bytes=0 need_bytes=320 device_bytes=1000 planned_bytes=280 fits=yes "
      "compile_s=1.500\n");
}
