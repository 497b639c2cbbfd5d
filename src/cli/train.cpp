// `olmosft train RECIPE.yaml [key=value ...]`: supervised fine-tuning as the recipe says (docs/train.md).
#include <iostream>
#include <sstream>

#include "cli/verb.h"
#include "core/error.h"
#include "dist/comm.h"
#include "model/config.h"
#include "model/decoder_xla.h"
#include "model/model.h"
#include "train/compiled_plan.h"
#include "train/log_lines.h"
#include "train/plan.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace {

// The model factory hook: an HF directory to fine-tune (model.init) or a config.json to initialise. The
// model is built without parameter storage; the trainer's shards ask `fill` for what each process owns, so
// a process never holds the whole model while loading (docs/dist.md).
std::unique_ptr<olmosft::model::CausalLM> build_model(const olmosft::TrainConfig& c,
                                                      olmosft::model::ParamFill& fill) {
  olmosft::require_run_inputs(c);  // data.path, one of model.init / model.config
  const std::string& init = c.model.init;
  const std::string& cfg = c.model.config;
  olmosft::model::ModelConfig mc;
  if (!init.empty()) {
    fill = olmosft::model::hf_param_fill(init, &mc);
  } else {
    mc = olmosft::model::load_config(cfg);
    fill = olmosft::model::init_param_fill(mc, static_cast<uint64_t>(c.seed));
  }
  if (c.device != "xla") return olmosft::model::make_model_unallocated(mc);
  const olmosft::model::XlaOptions xo = olmosft::train::recipe_xla_options(c);  // device: xla (docs/xla.md)
  olmosft::model::check_moe_capacity_mesh(mc, xo, c.moe.buffer_factor);         // before any weight is read
  return olmosft::model::make_model_unallocated(mc, [&](const olmosft::model::ModelConfig& m) {
    return std::make_unique<olmosft::model::XlaDecoder>(m, xo);
  });
}

int train_main(int argc, char** argv) {
  CLI::App app{"Fine-tune a model on a packed dataset as a recipe says (see docs/train.md)", "train"};
  std::string path;
  std::vector<std::string> overrides;
  app.add_option("recipe", path, "recipe YAML")->required();
  app.add_option("overrides", overrides, "key=value overrides (win over the file)");
  // Under mpirun every rank runs this verb; the communicator is created first (MPI_Init) and lives until
  // the verb returns (MPI_Finalize).
  std::unique_ptr<olmosft::dist::Comm> comm = olmosft::dist::make_comm();
  const bool multi = comm->size() > 1;
  auto body = [&] {
    olmosft::Recipe r = olmosft::Recipe::load(path, overrides);
    // devices = processes on CPU, times xla.devices on XLA: under mpirun or with xla.devices an unset
    // `devices` becomes that count.
    const int64_t per_process = olmosft::devices_per_process(r.fields());
    if (multi || per_process > 1)
      r.set_default(
          "devices", std::to_string(comm->size() * per_process),
          "mpirun -np " + std::to_string(comm->size()) + " x the mesh's " + std::to_string(per_process));
    const olmosft::TrainConfig cfg = r.config();
    // Batch arithmetic, dataset and tokenizer checks before the model is even loaded; run_training uses
    // this plan instead of making its own (rank 0 prints its warnings).
    std::ostringstream quiet;
    const olmosft::train::RunPlan plan = olmosft::train::plan_run(cfg, comm->rank() == 0 ? std::cerr : quiet);
    olmosft::require_xla_layout(cfg, comm->size(), olmosft::train::local_processes(comm->size()));
    // The memory plan from config.json alone (train/plan.h): a run that cannot fit is refused here, before
    // any weight is read.
    olmosft::require_run_inputs(cfg);
    const olmosft::train::MemoryPlan mp = olmosft::train::require_fit(
        olmosft::train::recipe_model_config(cfg), cfg, olmosft::train::local_processes(comm->size()));
    if (comm->rank() == 0) std::cout << olmosft::train::preflight_line(mp);
    olmosft::train::TrainOptions opts;
    std::unique_ptr<olmosft::model::CausalLM> m = build_model(cfg, opts.param_fill);
    opts.comm = comm.get();
    opts.plan = &plan;
    auto* xm = dynamic_cast<olmosft::model::XlaDecoder*>(m.get());
    auto xla_line = [&] {  // device: xla (docs/xla.md): the plugin, then at the end what it compiled and ran
      if (xm == nullptr || comm->rank() != 0) return;
      const olmosft::model::XlaRunStats& s = xm->stats();
      std::cout << olmosft::train::format_xla({xm->xla_options().plugin, xm->platform(),
                                               static_cast<int64_t>(xm->device_count()), s.compiles,
                                               s.compile_seconds, s.executions})
                << std::endl;
    };
    xla_line();
    if (xm != nullptr && comm->rank() == 0)  // one line per compiled program, before it first runs
      xm->on_compile([devices = xm->xla_options().devices()](const olmosft::model::XlaCompiled& c) {
        std::cout << olmosft::train::format_xla_program({c.kind, c.B, c.T, devices, c.seconds,
                                                         c.argument_bytes, c.output_bytes, c.alias_bytes,
                                                         c.temp_bytes, c.total_bytes})
                  << std::endl;
      });
    olmosft::train::TrainResult res = olmosft::train::run_training(cfg, *m, opts);
    xla_line();
    if (res.exit_code != 0 && comm->rank() == 0)
      std::cerr << "olmosft train: exit " << res.exit_code << ": " << res.reason << "\n";
    return res.exit_code;
  };
  if (!multi) return olmosft::cli::run_app(app, argc, argv, body);
  // Several processes: an error on one rank must not leave the others waiting in a collective, so it
  // ends the whole job (MPI_Abort, exit code 2 as for a single process).
  return olmosft::cli::run_app(app, argc, argv, [&]() -> int {
    try {
      return body();
    } catch (const std::exception& e) {
      comm->abort(olmosft::train::kExitError,
                  std::string("olmosft train: rank ") + std::to_string(comm->rank()) + ": " + e.what());
    }
    return olmosft::train::kExitError;  // not reached (abort ends the process)
  });
}

}  // namespace

OLMOSFT_VERB("train", "fine-tune a model as a recipe says (checkpoints, resume, guards)", train_main);
