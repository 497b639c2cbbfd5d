// `olmosft plan RECIPE [key=value ...]`: the run's memory and compute plan per device, by part, and whether
// it fits (train/plan.h, docs/plan.md). Reads the recipe and the model's config.json only.
#include "train/plan.h"

#include <iostream>

#include "cli/verb.h"
#include "core/error.h"
#include "model/config.h"
#include "train/compiled_plan.h"
#include "train/flops.h"

namespace {

int plan_main(int argc, char** argv) {
  CLI::App app{"Print a run's memory and compute plan per device and whether it fits (docs/plan.md)", "plan"};
  std::string path, device = "cpu", model;
  std::vector<std::string> overrides;
  int64_t devices = 0;
  double headroom = 0.9, mfu = 0.4, peak_tflops = -1;
  app.add_option("recipe", path, "recipe YAML")->required();
  app.add_option("overrides", overrides, "key=value overrides (win over the file)");
  app.add_option("--device", device,
                 "cpu (this machine's RAM shared by the local processes), cpu-<N>gib (N GiB per process), "
                 "h100-80gb, h200-141gb, a100-80gb or tpu-v4");
  app.add_option("--devices", devices, "devices taking part (the recipe key `devices`)");
  app.add_option(
      "--model", model,
      "the model to plan instead of the recipe's model.init/model.config: a config.json or a preset "
      "name (olmo3-7b, olmo3moe-small, ...)");
  app.add_option("--headroom", headroom, "fraction of device memory a run may use")->capture_default_str();
  app.add_option("--mfu", mfu, "model FLOPs utilisation the step time is stated at")->capture_default_str();
  app.add_option(
      "--peak-tflops", peak_tflops,
      "peak TFLOP/s per device (default: the accelerator's dense bf16 peak; on CPU perf.peak_tflops, "
      "else measured with a 1024^3 SGEMM)");
  std::string save_config, compile;
  app.add_option("--save-model-config", save_config, "also write the planned model's config.json here");
  app.add_option(
      "--compile", compile,
      "also compile the recipe's step for this slice ahead of time and print the compiled per-device "
      "memory (a PLAN compiled=yes line; tpu-v4:XxYxZ through libtpu: scripts/install-deps.sh --tpu; "
      "h100:HOSTSxGPUS, h200:..., b200:... through XLA's CUDA plugin without a GPU: --cuda; devices "
      "defaults to the slice's chips or the cluster's GPUs; docs/plan.md \"Compiled plans\")");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    if (devices <= 0 && !compile.empty()) devices = olmosft::train::slice_devices(compile);
    if (devices > 0) overrides.push_back("devices=" + std::to_string(devices));
    if (!compile.empty() && device == "cpu") device = olmosft::train::planner_device(compile);
    const olmosft::TrainConfig cfg = olmosft::Recipe::load(path, overrides).config();
    olmosft::model::ModelConfig m;
    std::string note;
    if (model.empty()) {
      m = olmosft::train::recipe_model_config_or_preset(cfg, &note);
      if (!note.empty()) std::cerr << note << "\n";
    } else if (model.find('/') == std::string::npos && model.find(".json") == std::string::npos)
      m = olmosft::model::parse_config(olmosft::model::preset_config_json(model), "preset " + model);
    else
      m = olmosft::model::load_config(model);
    if (!save_config.empty()) olmosft::model::save_config(m, save_config);
    olmosft::train::PlanOptions o;
    o.device = olmosft::train::parse_device(device, cfg.batch.devices, "--device");
    o.headroom = headroom;
    o.mfu = mfu;
    o.threads = cfg.compute.threads;
    if (peak_tflops > 0)
      o.device.peak_flops = peak_tflops * 1e12;
    else if (o.device.kind == olmosft::train::DeviceKind::Cpu)
      o.device.peak_flops =
          cfg.perf.peak_tflops > 0 ? cfg.perf.peak_tflops * 1e12 : olmosft::train::measure_peak_flops(1);
    const olmosft::train::MemoryPlan p = olmosft::train::make_plan(m, cfg, o);
    std::cout << olmosft::train::format_plan(p);
    if (compile.empty()) return p.fits ? 0 : 1;
    const olmosft::train::CompiledPlan c = olmosft::train::compile_plan(m, cfg, compile);
    std::cout << olmosft::train::compiled_plan_line(c, int64_t(p.step_peak));
    std::cout << olmosft::train::compiled_plan_summary(c, int64_t(p.step_peak));
    std::cout << olmosft::train::compiled_plan_loop_lines(c);
    std::cout << olmosft::train::compiled_plan_process_lines(c);
    return c.fits ? 0 : 1;
  });
}

}  // namespace

OLMOSFT_VERB("plan", "print a run's memory/compute plan per device and whether it fits", plan_main);
