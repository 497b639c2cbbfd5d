// The SFT training loop: preflight checks, deterministic data order, one global token-mean loss per step
// over gradient accumulation, clip + AdamW + schedule, metrics (stdout lines, metrics.jsonl, TensorBoard),
// guards (step guard, NaN guard), atomic checkpoints with resume, SIGTERM preemption, HF export and the
// runbook's end-of-run checks. See docs/train.md for the line formats, exit codes and layouts.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "dist/comm.h"
#include "model/model.h"
#include "train/batch.h"
#include "train/recipe.h"

namespace olmosft::train {

// Exit codes of `olmosft train` (also TrainResult::exit_code).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 2;        // bad recipe / dataset / model (olmosft::Error; the CLI's code)
inline constexpr int kExitStepGuard = 3;    // fewer steps completed than asked (STEP-GUARD line)
inline constexpr int kExitNonFinite = 4;    // NaN/inf loss or grad norm: last good step checkpointed
inline constexpr int kExitCheckFailed = 5;  // training done, but an end-of-run CHECK failed (no trained EOS)
inline constexpr int kExitPreempted = 143;  // SIGTERM: checkpoint written, restart to resume (128 + 15)
inline constexpr int kExitInterrupted = 130;  // SIGINT (Ctrl-C): checkpoint written, restart to resume

struct RunPlan;

struct TrainOptions {
  std::ostream* out = nullptr;  // PREFLIGHT / LOSS-PARTS / PROGRESS / CHECK / STEP-GUARD lines (std::cout)
  std::ostream* err = nullptr;  // warnings (std::cerr)
  // Called after each completed (applied) step; tests use it to raise(SIGTERM) or inject faults.
  std::function<void(int64_t step)> after_step;
  // HF export of the final weights; default: model::export_hf_dir with the tokenizer dir's side files.
  std::function<void(const std::string& out_dir, model::CausalLM& model, const std::string& tokenizer_dir)>
      export_hf;
  bool install_sigterm_handler = true;
  // The process group (mpirun): nullptr = one process. Every rank calls run_training with the same recipe;
  // rank 0 alone prints, logs metrics/TensorBoard, writes checkpoint manifests and runs the end-of-run
  // checks and export (the other ranks return after the final checkpoint, their model left without
  // parameter storage after a completed run). See docs/dist.md.
  dist::Comm* comm = nullptr;
  // For a model built without parameter storage (model::make_model_unallocated, as `olmosft train` builds
  // it): the initial weights, asked for only the elements each rank owns (model::hf_param_fill reads just
  // those bytes of the safetensors files; model::init_param_fill one tensor at a time). Empty: the model's
  // own values.
  model::ParamFill param_fill;
  // The preflight (plan_run) the caller already ran on the same config; nullptr: run_training runs it.
  const RunPlan* plan = nullptr;
};

struct TrainResult {
  int exit_code = kExitOk;
  std::string reason;             // one line when exit_code != 0
  int64_t start_step = 0;         // step the run resumed from (0 = fresh)
  int64_t last_step = 0;          // last step whose update was applied (and is in the newest checkpoint)
  std::vector<double> step_loss;  // total loss (ce + lm_z + moe_lb + router_z) of each step run here
  std::vector<double> step_ce;    // ce of each step run here
  std::string run_dir;
};

// The model-independent preflight: the config's batch arithmetic, the dataset opened and checked
// against the recipe (seq_len, epochs, tokenizer and chat-template hashes when a tokenizer is given) and
// the step count against the rows the epochs hold. The CLI runs it before loading the model and hands it to
// run_training (TrainOptions::plan), so it runs once per `olmosft train`. It changes no process state.
struct RunPlan {
  Derived d;
  std::shared_ptr<PackedDataset> ds;
  std::shared_ptr<DataOrder> order;
  int64_t epochs = 0;
  int32_t eos_id = -1;
  int64_t data_vocab = 0;
  std::string tokenizer;
};
RunPlan plan_run(const TrainConfig& cfg, std::ostream& err);
// The run's process-wide compute settings: the thread count (compute.threads) and the CPU GEMM set-up
// (compute.gemm, compute.dtype). run_training applies them once, after its preflight.
void apply_compute_settings(const TrainConfig& cfg);

// Runs (or resumes) training of `model` according to the recipe. Errors in the inputs throw olmosft::Error
// before any compute; guards and preemption are reported through TrainResult::exit_code.
TrainResult run_training(const TrainConfig& cfg, model::CausalLM& model, const TrainOptions& opts);

// The stop flag: SIGTERM or a first SIGINT (set by the handlers the trainer installs; exposed for tests).
bool sigterm_requested();
void clear_sigterm();

}  // namespace olmosft::train
