#include "train/recipe.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "train/schedule.h"

using namespace olmosft;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
Derived cfg(const Recipe& r) { return r.config().batch; }
}  // namespace

TEST(Recipe, RunbookRecipeDerivesTheRunbookNumbers) {
  TrainConfig c = Recipe::load(std::string(OLMOSFT_SOURCE_DIR) + "/recipes/olmo35-small-sft.yaml").config();
  const Derived& d = c.batch;
  EXPECT_EQ(d.slots, 16);
  EXPECT_EQ(d.grad_accum, 1);
  EXPECT_EQ(d.tokens_per_step, 16 * 65536);
  EXPECT_EQ(d.steps, 600);
  EXPECT_EQ(d.schedule_steps, 11768);
  EXPECT_EQ(d.warmup_steps, 353);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.moe.buffer_factor, 2.5);
}

TEST(Recipe, OverridesWinAndAreValidated) {
  TrainConfig c =
      Recipe::parse("steps: 10\noptimizer:\n  lr: 1e-4\n", "t.yaml", {"optimizer.lr=3e-4", "global_batch=8"})
          .config();
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.batch.global_batch, 8);
  EXPECT_TRUE(c.given.count("steps"));
  EXPECT_FALSE(c.given.count("seq_len"));
  EXPECT_EQ(c.batch.seq_len, 4096);  // documented default
  std::string e = error_of([] { Recipe::parse("steps: 10\n", "t.yaml", {"optimizer.lr=fast"}); });
  EXPECT_NE(e.find("optimizer.lr"), std::string::npos) << e;
  EXPECT_NE(e.find("expects a number"), std::string::npos) << e;
  e = error_of([] { Recipe::parse("steps: 10\n", "t.yaml", {"lr=1e-4"}); });
  EXPECT_NE(e.find("unknown recipe key 'lr'"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer.lr"), std::string::npos) << e;  // the suggestion
  e = error_of([] { Recipe::parse("stepz: 10\n", "my.yaml"); });
  EXPECT_NE(e.find("my.yaml"), std::string::npos) << e;
  EXPECT_NE(e.find("'steps'"), std::string::npos) << e;
  e = error_of([] { Recipe::parse("steps: [1, 2]\n", "my.yaml"); });
  EXPECT_NE(e.find("single value"), std::string::npos) << e;
  e = error_of([] { Recipe::parse("steps: 10\n", "my.yaml", {"noequals"}); });
  EXPECT_NE(e.find("key=value"), std::string::npos) << e;
  e = error_of([] { Recipe::parse("steps: 10\n  bad: [\n", "my.yaml"); });
  EXPECT_NE(e.find("not valid YAML"), std::string::npos) << e;
}

TEST(Recipe, BatchArithmeticRefusesWhatDoesNotDivide) {
  auto d = cfg(Recipe::parse("steps: 5\nglobal_batch: 16\ndevices: 2\nper_device_batch: 2\n", "t"));
  EXPECT_EQ(d.grad_accum, 4);
  std::string e = error_of([] { cfg(Recipe::parse("steps: 5\nglobal_batch: 16\ndevices: 3\n", "t")); });
  EXPECT_NE(e.find("global_batch=16 is not divisible"), std::string::npos) << e;
  e = error_of([] { cfg(Recipe::parse("steps: 5\ndevices: 3\nper_device_batch: 0.5\n", "t")); });
  EXPECT_NE(e.find("not a whole number"), std::string::npos) << e;
  e = error_of([] { cfg(Recipe::parse("global_batch: 16\n", "t")); });
  EXPECT_NE(e.find("zero steps"), std::string::npos) << e;
}

TEST(Schedule, MatchesTheOlmoCoreLinearWithWarmup) {
  Schedule s{"linear", 5e-5, 353, 11768, 0.0};
  EXPECT_NEAR(s.at(1), 5e-5 / 353, 1e-15);  // 1.4164e-7: warmup starts from step one
  EXPECT_DOUBLE_EQ(s.at(353), 5e-5);
  EXPECT_NEAR(s.at(600), 4.8918e-5, 5e-10);  // the runbook's parity window end (OLMo-core value)
  EXPECT_DOUBLE_EQ(s.at(11768), 0.0);
  EXPECT_DOUBLE_EQ(s.at(20000), 0.0);
  for (int64_t i = 354; i < 11768; ++i) ASSERT_LT(s.at(i + 1), s.at(i));
  Schedule c{"constant", 1e-3, 10, 100, 0.0};
  EXPECT_DOUBLE_EQ(c.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(c.at(50), 1e-3);
  Schedule f{"linear", 1.0, 0, 10, 0.1};
  EXPECT_DOUBLE_EQ(f.at(10), 0.1);
  EXPECT_NEAR(f.at(5), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_THROW(s.at(0), Error);
}

TEST(Recipe, ConfigIsTypedOnceWithSectionsAndPassThrough) {
  TrainConfig c =
      Recipe::parse(
          "run_name: r\noutput_dir: /o\nsteps: 3\nglobal_batch: 8\nper_device_batch: 2\ndevices: 2\n"
          "optimizer:\n  lr: 2e-4\n  schedule: constant\nloss:\n  lm_z: 0\ncheckpoint:\n  resume: false\n"
          "mesh:\n  fsdp: 2\ncluster:\n  queue: q\n  stop_rules:\n    nan_loss: false\n"
          "  command: [a, b]\n",
          "t.yaml", {"log.tensorboard=false", "dist.mode=zero3"})
          .config();
  EXPECT_EQ(c.source, "t.yaml");
  EXPECT_EQ(c.run_dir(), "/o/r");
  EXPECT_EQ(c.batch.slots, 4);
  EXPECT_EQ(c.batch.grad_accum, 2);
  EXPECT_EQ(c.batch.schedule_steps, 3);  // 0 = steps
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-4);
  EXPECT_EQ(c.optimizer.schedule, "constant");
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);  // default
  EXPECT_DOUBLE_EQ(c.loss.weight[model::kLossLmZ], 0);
  EXPECT_DOUBLE_EQ(c.loss.weight[model::kLossMoeLb], 0.01);
  EXPECT_FALSE(c.checkpoint.resume);
  EXPECT_FALSE(c.log.tensorboard);
  EXPECT_TRUE(c.export_.hf);
  EXPECT_EQ(c.dist.mode, "zero3");
  EXPECT_EQ(c.mesh.at("fsdp"), 2);
  EXPECT_EQ(c.cluster.at("queue"), "q");
  EXPECT_EQ(c.cluster.at("stop_rules.nan_loss"), "false");
  EXPECT_NE(c.cluster.at("command").find("a"), std::string::npos);
  // The resolved YAML is the one printed at start and hashed into checkpoints.
  std::ostringstream os;
  Recipe::parse("steps: 3\n", "t.yaml").write_yaml(os);
  EXPECT_EQ(Recipe::parse("steps: 3\n", "t.yaml").config().resolved_yaml, os.str());
}

TEST(Recipe, SetDefaultKeepsAGivenValue) {
  Recipe r = Recipe::parse("steps: 3\nglobal_batch: 4\n", "t.yaml");
  r.set_default("devices", "4", "mpirun -np 4");
  EXPECT_EQ(r.config().batch.devices, 4);
  Recipe g = Recipe::parse("steps: 3\nglobal_batch: 4\ndevices: 2\n", "t.yaml");
  g.set_default("devices", "4", "mpirun -np 4");
  EXPECT_EQ(g.config().batch.devices, 2);
}

TEST(Recipe, FieldsAreRangeCheckedWithTheKeyNamed) {
  auto e = [](const std::string& yaml, const std::vector<std::string>& ov = {}) {
    return error_of([&] { (void)Recipe::parse(yaml, "t.yaml", ov).config(); });
  };
  EXPECT_NE(e("steps: 3\n", {"checkpoint.resume=yes"}).find("key 'checkpoint.resume' expects true or false"),
            std::string::npos);
  EXPECT_NE(e("steps: 3\n", {"seed=1.5"}).find("key 'seed' expects an integer"), std::string::npos);
  EXPECT_NE(e("steps: 3\n", {"dist.mode=fsdp"}).find("t.yaml: dist.mode: expected dp or zero3, got 'fsdp'"),
            std::string::npos);
  EXPECT_NE(e("steps: 3\n", {"optimizer.warmup_frac=1"}).find("optimizer.warmup_frac must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(
      e("steps: 3\n", {"lr_schedule_steps=-1"}).find("lr_schedule_steps must be >= 0 (0 = steps), got -1"),
      std::string::npos);
  EXPECT_NE(e("steps: 3\nmesh:\n  fsdp: two\n").find("t.yaml: key 'mesh.fsdp' expects an integer >= 1"),
            std::string::npos);
  EXPECT_NE(e("steps: 3\nmesh:\n  fsdp: 0\n").find("key 'mesh.fsdp'"), std::string::npos);
  // Issue #17: a key given twice is an error naming both lines (YAML readers differ on which wins), also
  // as a dotted key beside its nested form; run_name is one directory under output_dir.
  EXPECT_NE(e("steps: 3\nseed: 1\nseed: 2\n").find("t.yaml: key 'seed' is given twice (lines 2 and 3)"),
            std::string::npos)
      << e("steps: 3\nseed: 1\nseed: 2\n");
  EXPECT_NE(e("steps: 3\noptimizer.lr: 1\noptimizer:\n  lr: 2\n").find("key 'optimizer.lr' is given twice"),
            std::string::npos);
  for (const char* bad : {"run_name=../escaped", "run_name=", "run_name=a/b", "run_name=.."})
    EXPECT_NE(e("steps: 3\n", {bad}).find("must be one directory name under output_dir"), std::string::npos)
        << bad;
  EXPECT_EQ(e("steps: 3\n", {"run_name=olmo-3.5_sft"}), "");
  // Found by tests/fuzz/fuzz_recipe (docs/fuzz.md): a complex YAML key threw yaml-cpp's BadConversion (not an
  // olmosft::Error); global_batch x seq_len and devices x per_device_batch overflowed (undefined behaviour).
  EXPECT_NE(e("steps: 3\ncluster:\n  ? [a]\n  : 1\n").find("t.yaml: line 3: a key must be a plain name"),
            std::string::npos)
      << e("steps: 3\ncluster:\n  ? [a]\n  : 1\n");
  EXPECT_NE(e("steps: 3\n{a: 1}: 2\n").find("a key must be a plain name, not a list or a map"),
            std::string::npos);
  EXPECT_NE(
      e("steps: 1\nglobal_batch: 9223372036854775807\nseq_len: 9223372036854775807\n")
          .find("global_batch x seq_len = 9223372036854775807 x 9223372036854775807 tokens per step does "
                "not fit in 64 bits"),
      std::string::npos);
  EXPECT_NE(e("steps: 1\ndevices: 9223372036854775807\nper_device_batch: 1e10\n")
                .find("which is not a whole number >= 1 (and at most 2^62)"),
            std::string::npos);
  // Batch numbers that do not divide name the keys whatever the other keys say.
  EXPECT_NE(e("steps: 3\nglobal_batch: 6\nper_device_batch: 4\n").find("global_batch=6 is not divisible"),
            std::string::npos);
}

// `device: cpu|xla|cuda`. olmosft has no hand-written CUDA backend (GPUs train through device=xla), so
// device=cuda is read (a k8s render of a GPU recipe needs it) but refused by the run's preflight, before any
// file is opened.
TEST(Recipe, DeviceKeyAndCudaRefusal) {
  EXPECT_EQ(Recipe::parse("steps: 3\n", "t.yaml").config().device, "cpu");  // the default
  TrainConfig c = Recipe::parse("steps: 3\ndevice: cuda\n", "gpu.yaml").config();
  EXPECT_EQ(c.device, "cuda");
  std::string e = error_of([] { (void)Recipe::parse("steps: 3\ndevice: gpu\n", "bad.yaml").config(); });
  EXPECT_NE(e.find("bad.yaml: device: expected cpu, xla or cuda, got 'gpu'"), std::string::npos) << e;
  e = error_of([] { (void)Recipe::parse("steps: 3\n", "t.yaml", {"device=CUDA"}).config(); });
  EXPECT_NE(e.find("device: expected cpu, xla or cuda, got 'CUDA'"), std::string::npos) << e;
  // device: xla (docs/xla.md) with its plugin keys
  c = Recipe::parse("steps: 3\ndevice: xla\nxla:\n  plugin: tpu\n  cpu_devices: 2\n", "x.yaml").config();
  EXPECT_EQ(c.device, "xla");
  EXPECT_EQ(c.xla.plugin, "tpu");
  EXPECT_EQ(c.xla.cpu_devices, 2);
  EXPECT_EQ(Recipe::parse("steps: 3\n", "t.yaml").config().xla.plugin, "cpu");
  EXPECT_EQ(Recipe::parse("steps: 3\n", "t.yaml").config().xla.attention, "blockwise");
  EXPECT_EQ(Recipe::parse("steps: 3\nxla:\n  attention: cudnn\n", "x.yaml").config().xla.attention, "cudnn");
  e = error_of([] { (void)Recipe::parse("steps: 3\nxla.attention: flash\n", "x.yaml").config(); });
  EXPECT_NE(e.find("xla.attention: expected blockwise or cudnn, got 'flash'"), std::string::npos) << e;
  e = error_of([] { (void)Recipe::parse("steps: 3\nxla.cpu_devices: 0\n", "x.yaml").config(); });
  EXPECT_NE(e.find("xla.cpu_devices must be >= 1, got 0"), std::string::npos) << e;
  TrainConfig z = Recipe::parse("steps: 3\ndevice: xla\ndist:\n  mode: zero3\n", "z.yaml").config();
  z.data.path = "/nonexistent/data";
  e = error_of([&] { require_run_inputs(z); });
  EXPECT_NE(e.find("z.yaml: device=xla needs dist.mode dp"), std::string::npos) << e;
  c = Recipe::parse("steps: 3\ndevice: cuda\n", "gpu.yaml").config();
  c.data.path = "/nonexistent/data";  // never opened: the device is refused first
  c.model.init = "/nonexistent/hf";
  const std::string want =
      "gpu.yaml: device=cuda: olmosft has no hand-written CUDA backend; train on NVIDIA GPUs with device: "
      "xla and xla.plugin: cuda";
  e = error_of([&] { require_device_supported(c); });
  EXPECT_EQ(e.rfind(want, 0), 0u) << e;
  e = error_of([&] { require_run_inputs(c); });
  EXPECT_EQ(e.rfind(want, 0), 0u) << e;
  e = error_of([&] { require_run_inputs(c, /*model_from_recipe=*/false); });  // the trainer's preflight
  EXPECT_EQ(e.rfind(want, 0), 0u) << e;
  EXPECT_EQ(error_of([&] { require_run_inputs(c, true, /*check_device=*/false); }), "");
  c.device = "cpu";
  EXPECT_EQ(error_of([&] { require_device_supported(c); }), "");
  // device=xla on an accelerator: one process per host (each client would open all of its devices).
  EXPECT_EQ(error_of([&] { require_xla_layout(c, 1, 8); }), "");  // cpu
  c.device = "xla";
  EXPECT_EQ(error_of([&] { require_xla_layout(c, 1, 8); }), "");  // XLA's CPU plugin
  c.xla.plugin = "cuda";
  EXPECT_EQ(error_of([&] { require_xla_layout(c, 1, 1); }), "");
  EXPECT_EQ(
      error_of([&] { require_xla_layout(c, 1, 8); }),
      "gpu.yaml: device=xla with xla.plugin cuda: 8 processes on this host would share its accelerators "
      "(each PJRT client opens all of them); start one process per host, with xla.devices for how many of "
      "them it trains on (docs/xla.md)");
  c.xla.plugin = "/opt/pjrt/libtpu.so";
  EXPECT_NE(error_of([&] { require_xla_layout(c, 1, 2); }), "");
  // xla.devices splits each process's rows per micro-step (slots / processes) evenly.
  c.xla.devices = 2;
  c.batch.slots = 8;
  // devices is the job's XLA devices (processes x the mesh's): another explicit count is refused.
  EXPECT_EQ(
      error_of([&] { require_xla_layout(c, 2, 1); }),
      "gpu.yaml: devices=1 but the mesh (data=2 fsdp=1 expert=1 context=1) has 2 XLA devices per process x "
      "2 process(es) = 4: set devices to that (or leave it out: it defaults to it)");
  c.batch.devices = 4;
  EXPECT_EQ(error_of([&] { require_xla_layout(c, 2, 1); }), "");
  c.batch.devices = 16;
  EXPECT_EQ(
      error_of([&] { require_xla_layout(c, 8, 1); }),
      "gpu.yaml: the mesh (data=2 fsdp=1 expert=1 context=1) splits each process's rows per micro-step "
      "evenly over data x fsdp = 2 devices; devices x per_device_batch / processes = 1 is not a multiple "
      "(per_device_batch counts rows per XLA device)");
  // The mesh keys: the older spelling maps onto them, other axis names and mixed spellings are refused, and
  // a row's tokens must split over expert x context.
  EXPECT_EQ(xla_mesh(c), (olmosft::xla::Mesh{.data = 2}));
  c.xla.shard_params = true;
  EXPECT_EQ(xla_mesh(c), (olmosft::xla::Mesh{.fsdp = 2}));
  c.mesh = {{"fsdp", 2}, {"context", 4}};
  EXPECT_NE(error_of([&] { xla_mesh(c); }).find("xla.shard_params is the older spelling of a mesh"),
            std::string::npos);
  c.xla.shard_params = false;
  EXPECT_NE(error_of([&] {
              xla_mesh(c);
            }).find("xla.devices 2 but the mesh (data=1 fsdp=2 expert=1 context=4) has 8"),
            std::string::npos);
  c.xla.devices = 1;
  EXPECT_EQ(xla_mesh(c), (olmosft::xla::Mesh{.fsdp = 2, .context = 4}));
  EXPECT_EQ(devices_per_process(c), 8);
  c.batch.seq_len = 30;
  c.batch.devices = 8;
  EXPECT_NE(error_of([&] { require_xla_layout(c, 1, 1); }).find("seq_len 30 is not a multiple"),
            std::string::npos);
  c.mesh = {{"tensor", 2}};
  EXPECT_NE(error_of([&] {
              xla_mesh(c);
            }).find("key 'mesh.tensor': device: xla knows the mesh axes data, fsdp, expert, context"),
            std::string::npos);
  // The device changes the numbers (bf16 compute on a GPU): not a key a resumed run may change silently.
  EXPECT_FALSE(recipe_key_operational("device"));
}

// The binary: `olmosft train` on a device=cuda recipe exits 2 with the refusal and writes nothing.
TEST(Recipe, TrainCliRefusesCudaBeforeAnyCompute) {
  const std::string dir = ::testing::TempDir() + "olmosft-device-" + std::to_string(::getpid());
  const std::string yaml = dir + ".yaml";
  {
    std::ofstream f(yaml);
    f << "run_name: cuda-run\noutput_dir: " << dir << "\ndevice: cuda\nsteps: 3\n"
      << "data:\n  path: /nonexistent/data\nmodel:\n  config: /nonexistent/config.json\n";
  }
  std::string out;
  FILE* p = ::popen((std::string(OLMOSFT_BINARY) + " train " + yaml + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << rc << "\n" << out;
  EXPECT_NE(out.find(yaml + ": device=cuda: olmosft has no hand-written CUDA backend"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("/nonexistent"), std::string::npos) << "a file was looked at first:\n" << out;
  EXPECT_FALSE(std::filesystem::exists(dir)) << "the run wrote into " << dir;
  std::remove(yaml.c_str());
}

// The schema (train/recipe_schema.cpp) is the only list of keys: names are unique, every key has a doc and a
// reader that accepts its default, and which keys a resumed run may change is exactly this list (a key moved
// between the two groups changes what a resume refuses, so it must be a deliberate edit here too).
TEST(RecipeSchema, OneTableOfKeysWithReadersAndResumeRules) {
  std::set<std::string> names, operational;
  for (const RecipeKey& k : recipe_keys()) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name << " twice";
    EXPECT_FALSE(k.doc.empty()) << k.name;
    ASSERT_TRUE(k.read) << k.name;
    TrainConfig c;
    if (k.name != "steps") {  // the one required key: its default 0 is refused
      EXPECT_NO_THROW(k.read(c, k.default_value, "t.yaml")) << k.name;
    }
    if (k.on_resume == OnResume::Operational) operational.insert(k.name);
    EXPECT_EQ(recipe_key_operational(k.name), k.on_resume == OnResume::Operational) << k.name;
    EXPECT_EQ(find_recipe_key(k.name), &k);
  }
  EXPECT_EQ(find_recipe_key("optimizer.lrr"), nullptr);
  const std::set<std::string> want = {"model.remat",
                                      "per_device_batch",
                                      "devices",
                                      "dist.mode",
                                      "dist.gather",
                                      "compute.threads",
                                      "checkpoint.every",
                                      "checkpoint.keep_last",
                                      "checkpoint.grace_seconds",
                                      "checkpoint.resume",
                                      "checkpoint.allow_recipe_change",
                                      "log.every",
                                      "guard.grad_norm_spike",
                                      "log.tensorboard",
                                      "eval.heldout",
                                      "export.hf",
                                      "perf.peak_tflops",
                                      "xla.cpu_devices",
                                      "xla.memory_limit_gib"};
  EXPECT_EQ(operational, want);
  EXPECT_TRUE(recipe_key_operational("cluster.queue"));
  EXPECT_TRUE(recipe_key_operational("mesh.fsdp"));
  // A reader names the recipe and the key when a value is out of range.
  TrainConfig c;
  try {
    find_recipe_key("steps")->read(c, "0", "t.yaml");
    ADD_FAILURE() << "steps=0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.yaml: steps must be >= 1"), std::string::npos) << e.what();
  }
}
