#include "train/trainer.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/threads.h"
#include "data/build_bytes_encoder.h"
#include "dist/model_shards.h"
#include "io/hash.h"
#include "kernels/adamw.h"
#include "model/hf_dir.h"
#include "train/evaluate.h"
#include "train/log_lines.h"
#include "train/perf.h"
#include "train/report.h"
#include "train/resume.h"
#include "train/schedule.h"
#include "train/step.h"

namespace fs = std::filesystem;

namespace olmosft::train {

namespace {

volatile std::sig_atomic_t g_sigterm = 0;  // the stop signal received (SIGTERM or SIGINT), 0 = none

// SIGTERM (preemption) and a first SIGINT (Ctrl-C) ask the run to stop after the current step with a
// checkpoint; a second SIGINT ends the process at once (the default action).
extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_sigterm == SIGINT) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  g_sigterm = sig;
  if (sig == SIGINT) {
    static const char kMsg[] =
        "\nINTERRUPT: stopping after this step with a checkpoint (Ctrl-C again to quit at once, losing it)\n";
    [[maybe_unused]] auto n = ::write(2, kMsg, sizeof(kMsg) - 1);
  }
}

}  // namespace

bool sigterm_requested() { return g_sigterm != 0; }
void clear_sigterm() { g_sigterm = 0; }

// ---- the run ------------------------------------------------------------------------------------------

RunPlan plan_run(const TrainConfig& cfg, std::ostream& err) {
  const std::string& src = cfg.source;
  RunPlan p;
  p.d = cfg.batch;
  const Derived& d = p.d;
  require_run_inputs(cfg, /*model_from_recipe=*/false);  // the caller built the model
  const std::string data_path = cfg.data.path;
  p.ds = std::make_shared<PackedDataset>(PackedDataset::open(data_path));
  const PackedDataset& ds = *p.ds;
  const nlohmann::json& man = ds.manifest();
  OLMO_CHECK(ds.seq_len() == d.seq_len, src, ": seq_len=", d.seq_len, " but dataset ", data_path,
             " was built with seq_len ", ds.seq_len(), " (rebuild it or set seq_len=", ds.seq_len(), ")");
  const int64_t epochs = p.epochs = cfg.data.epochs;
  OLMO_CHECK(epochs <= ds.epochs(), src, ": data.epochs=", epochs, " but dataset ", data_path, " holds ",
             ds.epochs(), " epoch(s) (build it with --epochs ", epochs, ")");
  OLMO_CHECK(man.contains("tokenizer") && man["tokenizer"].is_object(), "dataset ", data_path,
             "/manifest.json: missing the tokenizer section");
  const nlohmann::json& mtok = man["tokenizer"];
  p.eos_id = mtok.value("eos_id", -1);
  p.data_vocab = mtok.value("vocab_size", static_cast<int64_t>(0));
  p.tokenizer = cfg.tokenizer;
  const std::string& tok_spec = p.tokenizer;
  if (!tok_spec.empty()) {
    std::unique_ptr<ChatEncoder> enc = open_chat_encoder(tok_spec);
    std::string th = enc->tokenizer_hash(), ph = enc->template_hash();
    std::string mh = mtok.value("tokenizer_sha256", ""), mp = mtok.value("template_sha256", "");
    OLMO_CHECK(th == mh, src, ": tokenizer ", tok_spec, " (sha256 ", th, ") is not the tokenizer dataset ",
               data_path, " was built with (manifest tokenizer.tokenizer_sha256 ", mh, ", spec '",
               mtok.value("spec", ""), "'); rebuild the dataset or fix the recipe's tokenizer");
    OLMO_CHECK(ph == mp, src, ": chat template of ", tok_spec, " (sha256 ", ph,
               ") differs from the one dataset ", data_path,
               " was built with (manifest tokenizer.template_sha256 ", mp, ")");
  } else {
    err << "WARNING: " << src << ": no tokenizer given; the dataset's tokenizer (" << mtok.value("spec", "?")
        << ") is not checked and no tokenizer files are copied into the HF export\n";
  }
  std::vector<int64_t> rows_per_epoch;
  for (int e = 0; e < epochs; ++e) rows_per_epoch.push_back(ds.rows(e));
  p.order = std::make_shared<DataOrder>(rows_per_epoch, d.global_batch);
  const DataOrder& order = *p.order;
  OLMO_CHECK(d.steps <= order.max_steps(), src, ": steps=", d.steps, " needs ", d.steps * d.global_batch,
             " rows (global_batch ", d.global_batch, ") but data.epochs=", epochs, " of dataset ", data_path,
             " hold ", order.total_rows(), " rows = ", order.max_steps(),
             " steps; lower steps or raise data.epochs (build the dataset with more --epochs)");
  return p;
}

namespace {

// The SIGTERM and SIGINT handlers of a run, restored when the run returns. In `olmosft` they run on the
// routed signal thread only (core/signals.h: a handler on a thread inside oneDNN's JIT GEMM corrupts memory).
class SigtermHandler {
 public:
  explicit SigtermHandler(bool install) {
    if (!install) return;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    on_term_ = sigaction(SIGTERM, &sa, &old_term_) == 0;
    on_int_ = sigaction(SIGINT, &sa, &old_int_) == 0;
  }
  ~SigtermHandler() {
    if (on_term_) sigaction(SIGTERM, &old_term_, nullptr);
    if (on_int_) sigaction(SIGINT, &old_int_, nullptr);
  }
  SigtermHandler(const SigtermHandler&) = delete;
  SigtermHandler& operator=(const SigtermHandler&) = delete;

 private:
  bool on_term_ = false, on_int_ = false;
  struct sigaction old_term_ {
  }, old_int_{};
};

// One run of run_training: preflight, set-up (run directory, resume, evaluation before), the step loop and
// the ending (guards, preemption, final checkpoint, checks, export). The parts live in step.cpp,
// resume.cpp, evaluate.cpp, perf.cpp and report.cpp.
class Run {
 public:
  Run(const TrainConfig& cfg, model::CausalLM& model, const TrainOptions& opts, dist::Comm& comm)
      : cfg_(cfg),
        model_(model),
        opts_(opts),
        comm_(comm),
        world_(comm.size()),
        rank_(comm.rank()),
        // Rank 0 speaks for the job; the other ranks' lines go nowhere (errors still throw on every rank).
        out_(rank_ != 0 ? null_
             : opts.out ? *opts.out
                        : std::cout),
        err_(rank_ != 0 ? null_
             : opts.err ? *opts.err
                        : std::cerr) {}

  TrainResult go() {
    preflight();  // everything checked before any compute
    setup();
    SigtermHandler handler(opts_.install_sigterm_handler);
    const StepContext ctx{comm_,
                          *shards_,
                          model_,
                          *plan_.ds,
                          *plan_.order,
                          lc_,
                          plan_.d.global_batch,
                          mb_rows_,
                          ga_,
                          leaves_,
                          static_cast<double>(cfg_.checkpoint.grace_seconds),
                          flops_.get(),
                          dt_ != nullptr};
    log_->begin();
    comm_.reset_stats();
    for (int64_t s = start_ + 1; s <= plan_.d.steps; ++s)
      if (!step(ctx, s)) break;
    // One line (rank 0) of distributed facts (train/perf.h dist_facts).
    const double steps_run = static_cast<double>(std::max<int64_t>(1, res_.last_step - start_));
    const DistLine dl = dist_facts(comm_, *shards_, ga_, steps_run, rss_between_steps_);
    out_ << format_dist(dl) << "\n";
    return finish();
  }

 private:
  void preflight();
  void setup();
  bool step(const StepContext& ctx, int64_t s);  // false: the loop stops
  // A step the guards reject: its update is not applied, the last good step is checkpointed; false.
  bool stop_bad_step(int64_t s, std::string reason) {
    if (s - 1 > 0 && saved_step_ != s - 1) save(s - 1);
    stop_reason_ = std::move(reason);
    stop_code_ = kExitNonFinite;
    return false;
  }
  TrainResult finish();
  void save(int64_t step) {
    sync_from_device(step);
    carried_["grad_norms"] = grad_guard_.to_json();  // the guard's history, for a resume
    ckpt_->save(step, carried_);
    saved_step_ = step;
  }
  // Training state on the model's device (model.h DeviceTraining): the master gets the parameters and moments
  // of the last applied step `step`.
  void sync_from_device(int64_t step) {
    if (dt_ != nullptr) download_state(*dt_, shards_->params(), model_, step);
  }
  void export_hf();

  const TrainConfig& cfg_;
  model::CausalLM& model_;
  const TrainOptions& opts_;
  dist::Comm& comm_;
  const int world_, rank_;
  std::ostream null_{nullptr};
  std::ostream& out_;
  std::ostream& err_;
  TrainResult res_;
  RunPlan plan_;
  dist::ShardMode mode_ = dist::ShardMode::Replicated;
  int64_t mb_rows_ = 0, ga_ = 0, leaves_ = 0;
  model::LossConfig lc_;
  Schedule sched_;
  AdamWConfig acfg_;
  double clip_ = 0;
  std::string run_dir_, ckpt_root_;
  std::unique_ptr<RunDirLock> lock_;
  std::unique_ptr<FlopModel> flops_;
  double peak_ = 0;
  std::unique_ptr<dist::ModelShards> shards_;
  // The model keeps parameters, gradient sums and moments on its device (one process; nullptr: the host).
  model::DeviceTraining* dt_ = nullptr;
  nlohmann::json carried_ =
      nlohmann::json::object();  // facts carried across resumes (p_eos_before, step1_ce)
  int64_t start_ = 0, saved_step_ = 0;
  Heldout heldout_;
  std::unique_ptr<RunLog> log_;
  std::unique_ptr<Checkpointer> ckpt_;
  StepTimes times_;
  GradNormGuard grad_guard_{cfg_.guard.grad_norm_spike};
  std::string stop_reason_;
  int stop_code_ = kExitOk;
  bool preempt_ = false;
  double rss_between_steps_ = 0;
};

void apply_compute_settings(const TrainConfig& cfg) {
  if (cfg.compute.threads > 0) set_threads(static_cast<int>(cfg.compute.threads));
  set_cpu_gemm(cfg.compute.gemm);
}

void Run::preflight() {
  const std::string& src = cfg_.source;
  plan_ = opts_.plan ? *opts_.plan : plan_run(cfg_, err_);
  apply_compute_settings(cfg_);
  const Derived& d = plan_.d;
  const std::string data_path = plan_.ds->dir();
  const int64_t vocab = model_.config().vocab_size;
  OLMO_CHECK(plan_.data_vocab <= vocab, src, ": dataset ", data_path, " has token ids up to vocab_size ",
             plan_.data_vocab, " but the model's vocab_size is ", vocab);
  const model::MemoryPolicy& mem = cfg_.model.memory;
  OLMO_CHECK(model_.set_memory_policy(mem), src, ": model.remat=", model::remat_name(mem.remat),
             " with model.saved_dtype=", model::saved_dtype_name(mem.saved), " is not supported by the ",
             model_.config().model_type_name, " model");
  // Processes (mpirun -np N; docs/dist.md): each reads its own rows of every step (DataOrder::step_rows).
  // A step's rows are cut into `leaves` micro-batches of mb_rows rows, whatever N; rank p runs leaves
  // [p*leaves/N, (p+1)*leaves/N) in dp, leaves p, p+N, p+2N, ... in zero3 (dist::leaf_of). Leaf gradients
  // are summed in the perfect binary tree over the leaves in leaf order (dp: pairwise on the rank, then
  // across ranks; zero3: across ranks per round of N leaves, then the rounds pairwise on each shard), the
  // loss parts per leaf in leaf order: per-step losses and updates do not depend on N.
  mode_ = dist::parse_mode(cfg_.dist.mode);
  // devices = processes, times xla.devices on XLA (each process's devices split its rows)
  const int64_t per_process = devices_per_process(cfg_);
  OLMO_CHECK(world_ == 1 || d.devices == world_ * per_process, src, ": devices=", d.devices, " but ", world_,
             " processes were started (mpirun -np ", world_, ")",
             per_process > 1 ? " with xla.devices " + std::to_string(per_process) : std::string(),
             "; set devices=", world_ * per_process,
             " (`olmosft train` sets it when the recipe leaves it unset)");
  OLMO_CHECK(d.slots % world_ == 0, src, ": rows per micro-step devices x per_device_batch = ", d.slots,
             " is not divisible by the ", world_,
             " processes (per_device_batch must be a whole number of rows)");
  mb_rows_ = d.slots / world_;  // rows of one leaf
  ga_ = d.grad_accum;           // leaves per rank per step
  leaves_ = ga_ * world_;       // leaves per step

  const auto& opt = cfg_.optimizer;
  lc_ = {.weight = cfg_.loss.weight,
         .moe_buffer_factor = cfg_.moe.buffer_factor,
         .vocab_tile = cfg_.compute.vocab_tile};
  sched_ = {.kind = opt.schedule,
            .lr = opt.lr,
            .warmup_steps = d.warmup_steps,
            .horizon = d.schedule_steps,
            .final_frac = opt.final_lr_frac};
  acfg_ = {
      .lr = opt.lr, .beta1 = opt.beta1, .beta2 = opt.beta2, .eps = opt.eps, .weight_decay = opt.weight_decay};
  acfg_.validate();
  clip_ = cfg_.optimizer.clip_grad_norm;

  out_ << cfg_.resolved_yaml;
  print_derived(out_, d);
  out_ << "PREFLIGHT dataset=" << data_path << " epochs_used=" << plan_.epochs
       << " rows=" << plan_.order->total_rows() << " max_steps=" << plan_.order->max_steps()
       << " micro_batch_rows=" << mb_rows_ << " processes=" << world_
       << " dist_mode=" << dist::mode_name(mode_) << " leaves_per_step=" << leaves_
       << " eos_id=" << plan_.eos_id << " model_vocab=" << vocab << " dataset_vocab=" << plan_.data_vocab
       << " tokenizer=" << (plan_.tokenizer.empty() ? "unchecked" : "match") << "\n";
}

void Run::setup() {
  const Derived& d = plan_.d;
  const PackedDataset& ds = *plan_.ds;
  run_dir_ = cfg_.run_dir();
  res_.run_dir = run_dir_;
  ckpt_root_ = run_dir_ + "/checkpoints";
  lock_ = std::make_unique<RunDirLock>(comm_, run_dir_);  // before anything in the run dir is touched
  prepare_checkpoint_root(comm_, ckpt_root_);
  const std::string manifest_sha = io::sha256_file(ds.dir() + "/manifest.json");
  flops_ = std::make_unique<FlopModel>(model_.config());
  // Weights, gradients and AdamW moments live in the shards from here on (the model sees views).
  shards_ = std::make_unique<dist::ModelShards>(comm_, model_, mode_, cfg_.dist.gather == "layer",
                                                opts_.param_fill);
  // The model's own per-tensor values and gradients were just freed; glibc keeps freed heap blocks (tensors
  // under its mmap threshold) resident, which would add up to 2 x 4P to every step's peak RSS (measured:
  // bench/RESULTS.md "Memory plan"). Hand them back to the OS.
  ::malloc_trim(0);
  Resumed r = resume(cfg_, comm_, shards_->params(), ckpt_root_, ds.dir(), manifest_sha, out_, err_);
  start_ = saved_step_ = r.start;
  carried_ = std::move(r.carried);
  grad_guard_.load(carried_, ckpt_root_ + " (checkpoint of step " + std::to_string(start_) + ")");
  res_.start_step = start_;
  res_.last_step = start_;

  peak_ = run_peak(comm_, run_dir_, cfg_.perf.peak_tflops, out_);

  // Held-out rows for P(EOS): untrained rows of epoch 0 when the run does not reach them.
  heldout_ = heldout_rows(ds, cfg_.eval.heldout, d.steps, d.global_batch);
  if (start_ == 0 && !heldout_.rows.empty() && plan_.eos_id >= 0) {
    shards_->bind_params();  // collective (zero3); rank 0 alone evaluates and records it
    if (rank_ == 0) {
      auto [p, n] = p_eos(model_, ds, heldout_.rows, plan_.eos_id, lc_);
      carried_["p_eos_before"] = std::isfinite(p) ? nlohmann::json(p) : nlohmann::json(nullptr);
      carried_["p_eos_positions"] = n;
    }
    shards_->release_params();
  }
  log_ =
      std::make_unique<RunLog>(run_dir_, start_, d.steps, cfg_.log.every, cfg_.log.tensorboard, rank_ == 0);
  ckpt_ = std::make_unique<Checkpointer>(cfg_, shards_->params(), ckpt_root_, ds.dir(), manifest_sha, out_);
  // A model that can hold the training state on its device (device: xla) does; with several processes
  // (dist.mode dp: every process holds the whole model) it sums the step's gradients across them once per
  // step.
  if (mode_ == dist::ShardMode::Replicated && model_.device_training() != nullptr) {
    dt_ = model_.device_training();
    upload_state(*dt_, shards_->params(), model_);
    out_ << "DEVICE-STATE parameters, gradient sums and AdamW moments on the model's device from step "
         << start_ + 1 << "\n";
  }
}

bool Run::step(const StepContext& ctx, int64_t s) {
  const Derived& d = plan_.d;
  const auto t0 = Clock::now();
  StepOutcome o = run_step(ctx, s, t0);
  if (!o.error.empty()) {
    stop_reason_ = std::string("error at step ") + std::to_string(s) + ": " + o.error;
    err_ << "ERROR: " << stop_reason_ << "\n";
    stop_code_ = kExitStepGuard;
    return false;
  }
  if (o.abandoned) {
    out_ << "PREEMPTED step=" << s
         << " abandoned (SIGTERM; finishing it would exceed half the grace period)\n";
    preempt_ = true;
    return false;
  }
  OLMO_CHECK(o.parts.tokens == o.total, "model reported ", o.parts.tokens, " trained targets at step ", s,
             ", the data holds ", o.total);
  const StepLosses l = step_losses(o.parts, o.total, leaves_, lc_.weight);
  dist::ShardedParams& master = shards_->params();
  if (dt_ != nullptr && world_ > 1)  // collective: the leaves' sums of every rank, added
    dt_->all_reduce_grads([&](float* data, int64_t n) { comm_.all_reduce_sum(data, n); });
  const double gnorm = dt_ ? dt_->grad_norm() : master.grad_norm();  // collective; the same on every rank
  if (!std::isfinite(l.loss) || !std::isfinite(gnorm)) {
    out_ << "NAN-GUARD step=" << s << " loss=" << l.loss << " grad_norm=" << gnorm
         << ": update not applied; checkpointing the last good step " << (s - 1) << "\n";
    return stop_bad_step(s, "non-finite loss or gradient norm at step " + std::to_string(s));
  }
  if (const std::optional<double> median = grad_guard_.spike(gnorm)) {
    out_ << "GRAD-GUARD step=" << s << " grad_norm=" << gnorm << " median=" << *median
         << " factor=" << grad_guard_.factor() << ": update not applied (corrupted memory or a diverging "
         << "run; guard.grad_norm_spike); checkpointing the last good step " << (s - 1) << "\n";
    return stop_bad_step(s, "gradient norm " + std::to_string(gnorm) + " at step " + std::to_string(s) +
                                " is more than guard.grad_norm_spike x the recent median");
  }
  grad_guard_.add(gnorm);
  StepReport r;
  r.lr = dt_ ? apply_device_update(*dt_, acfg_, sched_, clip_, s)
             : apply_update(master, acfg_, sched_, clip_, s, gnorm);
  rss_between_steps_ = rss_bytes();
  r.step_time = seconds_since(t0);
  r.stalled = times_.add(s, r.step_time, err_);
  const double padded_tokens = static_cast<double>(d.tokens_per_step), dt = static_cast<double>(o.total);
  r.tokens_per_s = padded_tokens / r.step_time;
  r.trained_tokens_per_s = dt / r.step_time;
  r.model_flops = o.flops;
  r.mfu = peak_ > 0 ? o.flops / r.step_time / (peak_ * static_cast<double>(world_)) : 0.0;
  res_.last_step = s;
  res_.step_loss.push_back(l.loss);
  res_.step_ce.push_back(l.value[model::kLossCe]);
  if (s == 1) carried_["step1_ce"] = l.value[model::kLossCe];
  r.step = s;
  r.loss = l.loss, r.terms = l.value;
  r.grad_norm = gnorm;
  r.tokens = o.total;
  r.padded_tokens = d.tokens_per_step;
  r.moe = std::move(o.parts.moe);
  log_->step(r, out_);
  const int64_t every = cfg_.checkpoint.every;
  if (every > 0 && s % every == 0 && s != d.steps) save(s);
  out_.flush();  // the lines are read by watchers while the run goes on
  if (opts_.after_step) opts_.after_step(s);
  if (any_rank(comm_, sigterm_requested())) preempt_ = true;  // every rank stops after the same step
  return !(preempt_ && s != d.steps);
}

TrainResult Run::finish() {
  const int64_t steps = plan_.d.steps;
  sync_from_device(res_.last_step);  // the master (and through it the model) gets the last applied step
  if (stop_code_ == kExitNonFinite || stop_code_ == kExitStepGuard) {
    if (stop_code_ == kExitStepGuard) {
      out_ << "STEP-GUARD: step " << steps << " never completed (last completed step " << res_.last_step
           << "): " << stop_reason_ << "\n";
    }
    res_.exit_code = stop_code_;
    res_.reason = stop_reason_;
    shards_->finish();  // the model keeps the weights of the last applied step
    return res_;
  }
  preempt_ = preempt_ || any_rank(comm_, sigterm_requested());
  if (preempt_ && res_.last_step < steps) {
    const auto t0 = Clock::now();
    if (saved_step_ != res_.last_step) save(res_.last_step);
    const double took = seconds_since(t0), grace = static_cast<double>(cfg_.checkpoint.grace_seconds);
    if (took > grace)
      err_ << "WARNING: the preemption checkpoint took " << took << " s > grace " << grace << " s\n";
    const bool interrupted = g_sigterm == SIGINT;  // this rank's signal (others: forwarded by mpirun)
    const char* sig = interrupted ? "SIGINT" : "SIGTERM";
    res_.exit_code = interrupted ? kExitInterrupted : kExitPreempted;
    out_ << "PREEMPTED: " << sig << "; checkpoint of step " << res_.last_step << " written; exit "
         << res_.exit_code << " (restart to resume)\n";
    res_.reason = std::string(interrupted ? "interrupted" : "preempted") + " (" + sig + ") after step " +
                  std::to_string(res_.last_step);
    shards_->finish();
    return res_;
  }
  if (res_.last_step < steps) {
    out_ << "STEP-GUARD: step " << steps << " never completed (last completed step " << res_.last_step
         << ")\n";
    res_.exit_code = kExitStepGuard;
    res_.reason = "fewer steps than asked";
    shards_->finish();
    return res_;
  }
  if (saved_step_ != steps) save(steps);
  // Collective: rank 0's model holds the final weights; the others, which return now, never hold the whole
  // model (their peak stays at their shard plus one unit).
  shards_->finish(rank_ == 0);
  if (rank_ != 0) return res_;  // the end-of-run checks and the export are rank 0's
  out_ << "STEP-GUARD: reached step " << steps << (start_ == steps ? " (already, in the checkpoint)" : "")
       << "\n";
  if (times_.stalled() > 0)
    out_ << "STALLED steps=" << times_.stalled() << " (step time > 3x the running median)\n";
  const bool checks_ok =
      end_of_run_checks(model_, *plan_.ds, *plan_.order, steps, plan_.eos_id, lc_, heldout_, carried_, out_);
  if (cfg_.export_.hf) export_hf();
  if (!checks_ok) {
    res_.exit_code = kExitCheckFailed;
    res_.reason = "no trained EOS target in the data seen";
  }
  return res_;
}

void Run::export_hf() {
  const std::string hf = run_dir_ + "/hf";
  if (fs::exists(hf)) fs::remove_all(hf);
  const std::string& tok_spec = plan_.tokenizer;
  std::string side = tok_spec.rfind("builtin:", 0) == 0 ? "" : tok_spec;
  if (opts_.export_hf) {
    opts_.export_hf(hf, model_, side);
  } else {
    std::vector<safetensors::NamedTensor> named;
    for (const auto& p : model_.params()) named.push_back({p.name, p.value});
    model::ExportOptions eo;
    eo.copy_side_files_from = side;
    model::export_hf_dir(hf, model_.config(), named, eo);
  }
  out_ << "EXPORT hf=" << hf << "\n";
}

}  // namespace

TrainResult run_training(const TrainConfig& cfg, model::CausalLM& model, const TrainOptions& opts) {
  std::unique_ptr<dist::Comm> own_comm;
  if (!opts.comm) own_comm = dist::make_single_comm();
  dist::Comm& comm = opts.comm ? *opts.comm : *own_comm;
  Run run(cfg, model, opts, comm);
  return run.go();
}

}  // namespace olmosft::train
