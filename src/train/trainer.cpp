#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/threads.h"
#include "data/build_bytes_encoder.h"
#include "dist/model_shards.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "io/tensorboard.h"
#include "kernels/adamw.h"
#include "kernels/gemm.h"
#include "model/hf_dir.h"
#include "model/params.h"
#include "train/checkpoint.h"
#include "train/log_lines.h"
#include "train/metrics.h"
#include "train/schedule.h"

namespace fs = std::filesystem;

namespace olmosft::train {

namespace {

volatile std::sig_atomic_t g_sigterm = 0;
extern "C" void on_sigterm(int) { g_sigterm = 1; }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Measured fp32 peak of this process: the best of a few 1024^3 SGEMMs (OpenBLAS, all threads).
double measure_peak_flops() {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    gemm<float>(Trans::N, Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double dt = seconds_since(t0);
    if (dt > 0) best = std::max(best, 2.0 * n * n * n / dt);
  }
  return best;
}

// Model FLOPs (forward + backward), counted as the implementation does the work:
//   per token:          6 x N_body + attention (12 x heads x head_dim x ctx per layer; ctx = T/2 for full
//                       causal layers, min(window, T/2) for sliding ones; KDA/linear layers not counted)
//   per trained target: 6 x vocab x hidden for the LM head (the tiled cross-entropy skips untrained tokens)
// N_body = active parameters less the embedding (a lookup, no FLOPs) and the LM head.
struct ModelFlops {
  double per_token = 0, per_trained = 0;
  double step(double tokens, double trained) const { return per_token * tokens + per_trained * trained; }
};
ModelFlops model_flops(const model::CausalLM& m, std::vector<model::Param>& params, int64_t T) {
  const model::ModelConfig& c = m.config();
  double n_active = 0;
  for (const auto& p : params) n_active += static_cast<double>(p.value.numel());
  if (c.is_moe()) {
    try {
      n_active = static_cast<double>(model::count_params(c).active);
    } catch (const Error&) {
    }
  }
  const double head = static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size);
  const double n_body = std::max(0.0, n_active - 2.0 * head);
  double attn = 0;
  double hd = static_cast<double>(c.num_attention_heads * c.head_dim);
  for (model::LayerType lt : c.layer_types) {
    double ctx = 0.5 * static_cast<double>(T);
    if (lt == model::LayerType::SlidingAttention) ctx = std::min(static_cast<double>(c.sliding_window), ctx);
    if (lt == model::LayerType::LinearAttention) ctx = 0;
    attn += 12.0 * hd * ctx;
  }
  return {6.0 * n_body + attn, 6.0 * head};
}

struct StepParts {
  double ce_sum = 0, z_sum = 0, moe_lb = 0, router_z = 0;
  int64_t tokens = 0;
  std::map<int64_t, model::MoeLayerStats> moe;  // by layer: dropped summed, buffer factor max
};

// Resident set size of this process in bytes (VmRSS of /proc/self/status; 0 when unavailable).
double rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return 1024.0 * std::atof(line.c_str() + 6);
  return 0;
}

std::string bcast_string(dist::Comm& c, std::string s) {
  int64_t n = static_cast<int64_t>(s.size());
  c.broadcast(&n, 8, 0);
  s.resize(static_cast<size_t>(n));
  if (n > 0) c.broadcast(s.data(), n, 0);
  return s;
}

// True on every rank iff `local` is true on some rank (a collective when world > 1).
bool any_rank(dist::Comm& c, bool local) { return c.size() > 1 ? !c.all_ok(!local) : local; }

// Mean P(target) over positions whose trained target is `eos`; returns (mean, count). When `ce` is given it
// receives the CE sum and the trained-target count over the same rows (the same forwards).
struct EvalCe {
  double ce_sum = 0;
  int64_t targets = 0;
};
std::pair<double, int64_t> p_eos(model::CausalLM& m, const PackedDataset& ds, const std::vector<RowRef>& rows,
                                 int32_t eos, const model::LossConfig& lc, EvalCe* ce = nullptr) {
  double sum = 0;
  int64_t n = 0;
  for (const RowRef& r : rows) {
    HostBatch b = make_batch(ds, {r});
    std::vector<float> lp(static_cast<size_t>(b.T), 0.0f);
    model::LossParts parts = m.forward(b.view(), lc, nullptr, lp.data());
    if (ce) {
      ce->ce_sum += parts.ce_sum;
      ce->targets += parts.tokens;
    }
    for (int64_t t = 0; t < b.T; ++t) {
      if (b.trained[t] && b.targets[t] == eos) {
        sum += std::exp(static_cast<double>(lp[t]));
        ++n;
      }
    }
  }
  return {n ? sum / static_cast<double>(n) : std::nan(""), n};
}

}  // namespace

bool sigterm_requested() { return g_sigterm != 0; }
void clear_sigterm() { g_sigterm = 0; }

// ---- data order ---------------------------------------------------------------------------------------

DataOrder::DataOrder(std::vector<int64_t> rows_per_epoch, int64_t global_batch)
    : rows_(std::move(rows_per_epoch)), global_batch_(global_batch) {
  OLMO_CHECK(global_batch_ >= 1, "DataOrder: global_batch must be >= 1");
  for (int64_t r : rows_) {
    OLMO_CHECK(r >= 0, "DataOrder: negative row count");
    start_.push_back(total_);
    total_ += r;
  }
}

RowRef DataOrder::locate(int64_t g) const {
  OLMO_CHECK(g >= 0 && g < total_, "data order: global row ", g, " is outside the ", total_,
             " rows of the usable epochs");
  // The last epoch whose first global row is <= g and that has rows.
  size_t e = static_cast<size_t>(std::upper_bound(start_.begin(), start_.end(), g) - start_.begin()) - 1;
  while (rows_[e] == 0 || g - start_[e] >= rows_[e]) ++e;
  return RowRef{static_cast<int>(e), g - start_[e]};
}

std::vector<RowRef> DataOrder::step_rows(int64_t step, int rank, int world) const {
  OLMO_CHECK(step >= 1, "data order: steps are 1-based, got ", step);
  OLMO_CHECK(world >= 1 && rank >= 0 && rank < world, "data order: bad rank ", rank, " of ", world);
  OLMO_CHECK(global_batch_ % world == 0, "data order: global_batch=", global_batch_,
             " is not divisible by the number of processes ", world);
  int64_t per = global_batch_ / world;
  std::vector<RowRef> out;
  out.reserve(static_cast<size_t>(per));
  for (int64_t r = rank * per; r < (rank + 1) * per; ++r)
    out.push_back(locate((step - 1) * global_batch_ + r));
  return out;
}

model::Batch HostBatch::view() const {
  model::Batch b;
  b.B = B;
  b.T = T;
  b.tokens = tokens.data();
  b.segments = segments.data();
  b.positions = positions.data();
  b.targets = targets.data();
  b.trained = trained.data();
  return b;
}

HostBatch make_batch(const PackedDataset& ds, const std::vector<RowRef>& rows) {
  HostBatch b;
  b.B = static_cast<int64_t>(rows.size());
  b.T = ds.seq_len();
  size_t n = static_cast<size_t>(b.B * b.T);
  b.tokens.resize(n);
  b.segments.resize(n);
  b.positions.resize(n);
  b.targets.resize(n);
  b.trained.resize(n);
  for (int64_t i = 0; i < b.B; ++i) {
    PackedRow pr = ds.row(rows[i].epoch, rows[i].index);
    size_t o = static_cast<size_t>(i * b.T);
    std::copy(pr.tokens, pr.tokens + b.T, b.tokens.begin() + o);
    for (int64_t t = 0; t < b.T; ++t) b.segments[o + t] = pr.segment_ids[t] == 0 ? -1 : pr.segment_ids[t];
    pr.positions(b.positions.data() + o);
    pr.targets(b.targets.data() + o, -100);
    for (int64_t t = 0; t < b.T; ++t) {
      b.trained[o + t] = b.targets[o + t] != -100 ? 1 : 0;
      b.trained_count += b.trained[o + t];
    }
  }
  return b;
}

// ---- the run ------------------------------------------------------------------------------------------

RunPlan plan_run(const TrainConfig& cfg, std::ostream& err) {
  const std::string& src = cfg.source;
  RunPlan p;
  p.d = cfg.batch;
  const Derived& d = p.d;
  if (cfg.compute.threads > 0) set_threads(static_cast<int>(cfg.compute.threads));
  const std::string data_path = cfg.data.path;
  OLMO_CHECK(!data_path.empty(), src, ": data.path is required (a dataset written by `olmosft data build`)");
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

TrainResult run_training(const TrainConfig& cfg, model::CausalLM& model, const TrainOptions& opts) {
  std::unique_ptr<dist::Comm> own_comm;
  if (!opts.comm) own_comm = dist::make_single_comm();
  dist::Comm& comm = opts.comm ? *opts.comm : *own_comm;
  const int world = comm.size(), rank = comm.rank();
  // Rank 0 speaks for the job; the other ranks' lines go nowhere (errors still throw on every rank).
  std::ostream null_stream(nullptr);
  std::ostream& out = rank != 0 ? null_stream : opts.out ? *opts.out : std::cout;
  std::ostream& err = rank != 0 ? null_stream : opts.err ? *opts.err : std::cerr;
  const std::string& src = cfg.source;
  TrainResult res;

  // ---- preflight: everything below is checked before any compute ----
  RunPlan plan = plan_run(cfg, err);
  const Derived& d = plan.d;
  const PackedDataset& ds = *plan.ds;
  const DataOrder& order = *plan.order;
  const int64_t epochs = plan.epochs;
  const int32_t eos_id = plan.eos_id;
  const int64_t data_vocab = plan.data_vocab;
  const std::string& tok_spec = plan.tokenizer;
  const std::string data_path = ds.dir();
  const int64_t vocab = model.config().vocab_size;
  OLMO_CHECK(data_vocab <= vocab, src, ": dataset ", data_path, " has token ids up to vocab_size ",
             data_vocab, " but the model's vocab_size is ", vocab);
  // Processes (mpirun -np N; docs/dist.md): each reads its own rows of every step (DataOrder::step_rows).
  // A step's rows are cut into `leaves` micro-batches of mb_rows rows, whatever N; rank p runs leaves
  // [p*leaves/N, (p+1)*leaves/N). Leaf gradients are summed pairwise and then across ranks in a fixed tree,
  // the loss parts per leaf in leaf order: per-step losses and updates do not depend on N.
  const dist::ShardMode mode = dist::parse_mode(cfg.dist.mode);
  OLMO_CHECK(world == 1 || d.devices == world, src, ": devices=", d.devices, " but ", world,
             " processes were started (mpirun -np ", world, "); set devices=", world,
             " (`olmosft train` sets it to the process count when the recipe leaves it unset)");
  OLMO_CHECK(d.slots % world == 0, src, ": rows per micro-step devices x per_device_batch = ", d.slots,
             " is not divisible by the ", world,
             " processes (per_device_batch must be a whole number of rows)");
  const int64_t mb_rows = d.slots / world;  // rows of one leaf
  const int64_t ga = d.grad_accum;          // leaves per rank per step
  const int64_t leaves = ga * world;        // leaves per step

  model::LossConfig lc;
  lc.lm_z = cfg.loss.lm_z;
  lc.moe_lb = cfg.loss.moe_lb;
  lc.router_z = cfg.loss.router_z;
  lc.moe_buffer_factor = cfg.moe.buffer_factor;
  lc.vocab_tile = cfg.compute.vocab_tile;
  Schedule sched;
  sched.kind = cfg.optimizer.schedule;
  sched.lr = cfg.optimizer.lr;
  sched.warmup_steps = d.warmup_steps;
  sched.horizon = d.schedule_steps;
  sched.final_frac = cfg.optimizer.final_lr_frac;
  AdamWConfig acfg;
  acfg.beta1 = cfg.optimizer.beta1;
  acfg.beta2 = cfg.optimizer.beta2;
  acfg.eps = cfg.optimizer.eps;
  acfg.weight_decay = cfg.optimizer.weight_decay;
  acfg.lr = sched.lr;
  acfg.validate();
  const double clip = cfg.optimizer.clip_grad_norm;

  out << cfg.resolved_yaml;
  print_derived(out, d);
  out << "PREFLIGHT dataset=" << data_path << " epochs_used=" << epochs << " rows=" << order.total_rows()
      << " max_steps=" << order.max_steps() << " micro_batch_rows=" << mb_rows << " processes=" << world
      << " dist_mode=" << dist::mode_name(mode) << " leaves_per_step=" << leaves << " eos_id=" << eos_id
      << " model_vocab=" << vocab << " dataset_vocab=" << data_vocab
      << " tokenizer=" << (tok_spec.empty() ? "unchecked" : "match") << "\n";

  // ---- run directory, resume ----
  const std::string run_dir = cfg.run_dir();
  res.run_dir = run_dir;
  const std::string ckpt_root = run_dir + "/checkpoints";
  if (rank == 0) {
    fs::create_directories(ckpt_root);
    std::vector<fs::path> stale;  // staging dirs of interrupted saves
    for (const auto& e : fs::directory_iterator(ckpt_root)) {
      if (e.path().filename().string().find(".tmp-") != std::string::npos) stale.push_back(e.path());
    }
    for (const auto& p : stale) fs::remove_all(p);
  }
  comm.barrier();
  const std::string manifest_sha = io::sha256_file(ds.dir() + "/manifest.json");
  const std::string snapshot = cfg.resolved_yaml;
  std::vector<model::Param>& params = model.params();
  const ModelFlops flops = model_flops(model, params, d.seq_len);
  // Weights, gradients and AdamW moments live in the shards from here on (the model sees views).
  dist::ModelShards shards(comm, model, mode, cfg.dist.gather == "layer");
  dist::ShardedParams& master = shards.params();
  nlohmann::json carried = nlohmann::json::object();  // facts carried across resumes (p_eos_before, step1_ce)
  int64_t start = 0;
  if (cfg.checkpoint.resume) {
    std::string dir;
    if (rank == 0) dir = latest_valid_checkpoint(ckpt_root, err);  // verifies every checksum
    dir = bcast_string(comm, dir);
    if (!dir.empty()) {
      CheckpointState st = read_checkpoint_state(dir);
      const std::string ck_man = st.info.value("dataset_manifest_sha256", "");
      OLMO_CHECK(ck_man == manifest_sha, "checkpoint ", dir, " was written for dataset manifest sha256 ",
                 ck_man, " but ", data_path, "/manifest.json has sha256 ", manifest_sha,
                 "; the data position would be meaningless (use a new run_name or checkpoint.resume=false)");
      OLMO_CHECK(st.info.value("global_batch", int64_t{0}) == d.global_batch, "checkpoint ", dir,
                 " was written with global_batch ", st.info.value("global_batch", int64_t{0}),
                 ", recipe has ", d.global_batch, "; the data position would differ (use a new run_name)");
      OLMO_CHECK(st.step <= d.steps, "checkpoint ", dir, " is at step ", st.step, ", past steps=", d.steps);
      st = load_checkpoint_sharded(dir, master);
      start = st.step;
      carried = st.info.value("carried", nlohmann::json::object());
      out << "RESUME from=" << dir << " step=" << start << " next_global_row=" << start * d.global_batch
          << "\n";
    }
  } else if (rank == 0 && !list_checkpoints(ckpt_root).empty()) {
    err << "WARNING: checkpoint.resume=false: ignoring the checkpoints in " << ckpt_root << "\n";
  }
  res.start_step = start;
  res.last_step = start;

  double peak = cfg.perf.peak_tflops * 1e12;
  if (peak <= 0) peak = measure_peak_flops();
  out << "PREFLIGHT peak_flops=" << peak << (world > 1 ? " per process" : "")
      << (cfg.perf.peak_tflops > 0 ? " (configured)" : " (measured)")
      << " model_flops_per_token=" << flops.per_token
      << " lm_head_flops_per_trained_target=" << flops.per_trained << "\n";

  // Held-out rows for P(EOS): untrained rows of epoch 0 when the run does not reach them.
  std::vector<RowRef> heldout;
  bool truly_heldout = false;
  {
    int64_t h = cfg.eval.heldout;
    int64_t used0 = std::min(ds.rows(0), d.steps * d.global_batch);
    int64_t first = used0 < ds.rows(0) ? used0 : 0;
    truly_heldout = used0 < ds.rows(0);
    for (int64_t i = first; i < ds.rows(0) && static_cast<int64_t>(heldout.size()) < h; ++i)
      heldout.push_back(RowRef{0, i});
  }
  if (start == 0 && !heldout.empty() && eos_id >= 0) {
    shards.bind_params();  // collective (zero3); rank 0 alone evaluates and records it
    if (rank == 0) {
      auto [p, n] = p_eos(model, ds, heldout, eos_id, lc);
      carried["p_eos_before"] = std::isfinite(p) ? nlohmann::json(p) : nlohmann::json(nullptr);
      carried["p_eos_positions"] = n;
    }
    shards.release_params();
  }

  // ---- logs ----
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  if (rank == 0) {
    // Keep only the steps the resumed state contains (a crash may have logged steps past the checkpoint).
    std::string kept;
    if (start > 0 && fs::exists(metrics_path)) {
      std::istringstream is(io::read_file(metrics_path));
      std::string line;
      while (std::getline(is, line)) {
        try {
          auto j = nlohmann::json::parse(line);
          if (j.value("step", int64_t{0}) <= start) kept += line + "\n";
        } catch (const nlohmann::json::exception&) {
        }
      }
    }
    io::write_file_atomic(metrics_path, kept);
  }
  std::ofstream metrics;  // rank 0 only
  if (rank == 0) {
    metrics.open(metrics_path, std::ios::app);
    OLMO_CHECK(metrics.good(), "cannot open ", metrics_path, " for appending");
  }
  std::unique_ptr<io::TensorBoardWriter> tb;
  if (rank == 0 && cfg.log.tensorboard)
    tb = std::make_unique<io::TensorBoardWriter>(run_dir + "/tensorboard");

  struct sigaction old_sa {};
  bool handler_installed = false;
  if (opts.install_sigterm_handler) {
    struct sigaction sa {};
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    handler_installed = sigaction(SIGTERM, &sa, &old_sa) == 0;
  }
  struct RestoreHandler {
    bool on;
    struct sigaction sa;
    ~RestoreHandler() {
      if (on) sigaction(SIGTERM, &sa, nullptr);
    }
  } restore{handler_installed, old_sa};

  const int64_t keep_last = cfg.checkpoint.keep_last;
  const int64_t every = cfg.checkpoint.every;
  const double grace = static_cast<double>(cfg.checkpoint.grace_seconds);
  auto state_info = [&](int64_t step) {
    nlohmann::json j;
    j["data_position"] = {
        {"step", step},
        {"next_global_row", step * d.global_batch},
        {"rule", "row r of step s = global row (s-1)*global_batch + r over the epochs in order"}};
    j["global_batch"] = d.global_batch;
    j["seq_len"] = d.seq_len;
    j["dataset_dir"] = ds.dir();
    j["dataset_manifest_sha256"] = manifest_sha;
    j["recipe_sha256"] = io::sha256_hex(snapshot);
    j["rng"] = {{"kind", "philox"},
                {"seed", cfg.seed},
                {"note", "training draws no random numbers; the seed only initialises a fresh model"}};
    j["carried"] = carried;
    return j;
  };
  auto save = [&](int64_t step) {
    auto t0 = Clock::now();
    CheckpointState st;
    st.step = step;
    st.info = state_info(step);
    std::string dir = save_checkpoint_sharded(ckpt_root, master, st, snapshot, keep_last);
    out << "CHECKPOINT step=" << step << " dir=" << dir << " seconds=" << std::setprecision(3)
        << seconds_since(t0) << std::setprecision(6) << "\n";
    return dir;
  };

  // ---- the loop ----
  std::vector<double> times;
  int64_t stalled = 0, saved_step = start;
  auto run_t0 = Clock::now();
  std::string stop_reason;
  int stop_code = kExitOk;
  bool preempt = false;
  double rss_between_steps = 0;
  comm.reset_stats();
  for (int64_t s = start + 1; s <= d.steps; ++s) {
    auto t0 = Clock::now();
    StepParts sp;
    bool abandoned = false;
    int64_t total = 0, local_total = 0;
    std::string step_err;
    // This rank's rows, cut into its leaves (a data error on any rank stops every rank).
    std::vector<HostBatch> micro;
    try {
      std::vector<RowRef> rows = order.step_rows(s, rank, world);
      for (int64_t m = 0; m < ga; ++m) {
        std::vector<RowRef> mr(rows.begin() + m * mb_rows, rows.begin() + (m + 1) * mb_rows);
        micro.push_back(make_batch(ds, mr));
        local_total += micro.back().trained_count;
      }
    } catch (const Error& e) {
      step_err = e.what();
    }
    if (any_rank(comm, !step_err.empty()) && step_err.empty()) step_err = "a data error on another rank";
    if (step_err.empty()) {
      double t = static_cast<double>(local_total);  // exact: integer counts < 2^53
      comm.all_reduce_sum(&t, 1);
      total = static_cast<int64_t>(t);
      if (total <= 0)
        step_err = "step " + std::to_string(s) + ": no trained targets in its " +
                   std::to_string(d.global_batch) + " rows";
    }
    if (step_err.empty()) {
      shards.bind_for_step();  // zero3: whole-model all-gather, unless the model gathers per layer
      shards.begin_step(ga);
      std::vector<model::LossParts> parts(static_cast<size_t>(ga));
      Clock::time_point sig_seen{};
      bool sig_noted = false;
      for (int64_t m = 0; m < ga; ++m) {
        if (m > 0) {
          bool want = false;
          if (sigterm_requested()) {
            if (!sig_noted) {
              sig_seen = Clock::now();
              sig_noted = true;
            }
            double per_micro = seconds_since(t0) / static_cast<double>(m);
            want = seconds_since(sig_seen) + per_micro * static_cast<double>(ga - m) > 0.5 * grace;
          }
          if (any_rank(comm, want)) {
            abandoned = true;
            break;
          }
        }
        if (!step_err.empty()) continue;  // keep taking part in the collectives
        try {
          shards.begin_leaf();
          parts[static_cast<size_t>(m)] =
              model.forward_backward(micro[static_cast<size_t>(m)].view(), lc,
                                     1.0 / static_cast<double>(total), 1.0 / static_cast<double>(leaves));
          shards.end_leaf();
        } catch (const Error& e) {
          step_err = e.what();
        }
      }
      if (any_rank(comm, !step_err.empty()) && step_err.empty()) step_err = "an error on another rank";
      if (step_err.empty() && !abandoned) {
        // Loss parts of every leaf, gathered in leaf order and added in that order (any process count).
        double nm = static_cast<double>(parts[0].moe_layers.size());
        std::vector<double> nms(static_cast<size_t>(world));
        comm.all_gather(&nm, nms.data(), 1);
        for (double x : nms)
          OLMO_CHECK(x == nm, "step ", s, ": ranks report different numbers of MoE layers");
        const size_t R = 5 + 5 * static_cast<size_t>(nm);
        std::vector<double> mine(static_cast<size_t>(ga) * R), all(static_cast<size_t>(leaves) * R);
        for (size_t m = 0; m < parts.size(); ++m) {
          const model::LossParts& lp = parts[m];
          OLMO_CHECK(lp.moe_layers.size() == static_cast<size_t>(nm), "step ", s,
                     ": leaves report different numbers of MoE layers");
          double* r = &mine[m * R];
          r[0] = lp.ce_sum, r[1] = lp.z_sum, r[2] = lp.moe_lb, r[3] = lp.router_z;
          r[4] = static_cast<double>(lp.tokens);
          for (size_t k = 0; k < lp.moe_layers.size(); ++k) {
            const auto& ls = lp.moe_layers[k];
            double* q = r + 5 + 5 * k;
            q[0] = static_cast<double>(ls.layer), q[1] = ls.lb_loss, q[2] = ls.router_z;
            q[3] = ls.required_buffer_factor, q[4] = static_cast<double>(ls.dropped_tokens);
          }
        }
        comm.all_gather(mine.data(), all.data(), static_cast<int64_t>(mine.size()));
        for (int64_t l = 0; l < leaves; ++l) {
          const double* r = &all[static_cast<size_t>(l) * R];
          sp.ce_sum += r[0];
          sp.z_sum += r[1];
          sp.moe_lb += r[2];
          sp.router_z += r[3];
          sp.tokens += static_cast<int64_t>(r[4]);
          for (size_t k = 0; k + 5 < R; k += 5) {
            const double* q = r + 5 + k;
            auto& acc = sp.moe[static_cast<int64_t>(q[0])];
            acc.layer = static_cast<int64_t>(q[0]);
            acc.dropped_tokens += static_cast<int64_t>(q[4]);
            acc.required_buffer_factor = std::max(acc.required_buffer_factor, q[3]);
            acc.lb_loss += q[1] / static_cast<double>(leaves);
            acc.router_z += q[2] / static_cast<double>(leaves);
          }
        }
        shards.reduce();  // leaf sums -> reduce-scatter (zero3) / all-reduce (dp)
      }
      shards.release_params();
    }
    if (!step_err.empty()) {
      stop_reason = std::string("error at step ") + std::to_string(s) + ": " + step_err;
      err << "ERROR: " << stop_reason << "\n";
      stop_code = kExitStepGuard;
      break;
    }
    if (abandoned) {
      out << "PREEMPTED step=" << s
          << " abandoned (SIGTERM; finishing it would exceed half the grace period)\n";
      preempt = true;
      break;
    }
    OLMO_CHECK(sp.tokens == total, "model reported ", sp.tokens, " trained targets at step ", s,
               ", the data holds ", total);
    const double dt = static_cast<double>(total);
    const double ce = sp.ce_sum / dt, lmz = lc.lm_z * sp.z_sum / dt;
    const double moe_lb = sp.moe_lb / static_cast<double>(leaves),
                 rz = sp.router_z / static_cast<double>(leaves);
    const double loss = ce + lmz + moe_lb + rz;
    const double gnorm = master.grad_norm();  // collective; the same on every rank
    if (!std::isfinite(loss) || !std::isfinite(gnorm)) {
      out << "NAN-GUARD step=" << s << " loss=" << loss << " grad_norm=" << gnorm
          << ": update not applied; checkpointing the last good step " << (s - 1) << "\n";
      if (s - 1 > 0 && saved_step != s - 1) saved_step = (save(s - 1), s - 1);
      stop_reason = "non-finite loss or gradient norm at step " + std::to_string(s);
      stop_code = kExitNonFinite;
      break;
    }
    const double lr = sched.at(s);
    acfg.lr = lr;
    master.clip_and_step(acfg, clip, s, gnorm);  // clip, then AdamW on what this rank owns
    rss_between_steps = rss_bytes();

    const double step_time = seconds_since(t0);
    bool is_stalled = false;
    if (times.size() >= 3 && step_time > 3.0 * median(times)) {
      is_stalled = true;
      ++stalled;
      err << "WARNING: step " << s << " stalled: " << step_time << " s vs running median " << median(times)
          << " s\n";
    }
    times.push_back(step_time);
    const double padded_tokens = static_cast<double>(d.tokens_per_step);
    const double tps = padded_tokens / step_time, trained_tps = dt / step_time;
    const double mfu =
        peak > 0 ? flops.step(padded_tokens, dt) / step_time / (peak * static_cast<double>(world)) : 0.0;
    res.last_step = s;
    res.step_loss.push_back(loss);
    res.step_ce.push_back(ce);
    if (s == 1) carried["step1_ce"] = ce;

    if (!sp.moe.empty()) {  // every step: `k8s watch`'s max_required_rbf rule reads it
      double max_rbf = 0;
      for (const auto& [layer, ls] : sp.moe) max_rbf = std::max(max_rbf, ls.required_buffer_factor);
      out << format_required_rbf({s, max_rbf}) << "\n";
    }
    if (s % cfg.log.every == 0 || s == d.steps || s == start + 1) {
      out << format_loss_parts({s, ce, lmz, moe_lb, rz, total}) << "\n";
      double elapsed = seconds_since(run_t0);
      double rate = static_cast<double>(s - start) / elapsed;
      out << format_progress({s, d.steps, rate, tps, elapsed, static_cast<double>(d.steps - s) / rate})
          << "\n";
    }
    nlohmann::json row;
    row["step"] = s;
    row["lr"] = lr;
    row["loss"] = loss;
    row["ce"] = ce;
    row["lm_z"] = lmz;
    row["moe_lb"] = moe_lb;
    row["router_z"] = rz;
    row["grad_norm"] = gnorm;
    row["tokens"] = total;
    row["padded_tokens"] = d.tokens_per_step;
    row["tokens_per_s"] = tps;
    row["trained_tokens_per_s"] = trained_tps;
    row["step_time"] = step_time;
    row["mfu"] = mfu;
    row["stalled"] = is_stalled;
    nlohmann::json dropped = nlohmann::json::array(), rbf = nlohmann::json::array();
    for (const auto& [layer, ls] : sp.moe) {
      dropped.push_back(ls.dropped_tokens);
      rbf.push_back(ls.required_buffer_factor);
    }
    row["moe_dropped_tokens"] = dropped;
    row["moe_required_buffer_factor"] = rbf;
    metrics << row.dump() << "\n";
    metrics.flush();
    if (tb) tb->add_scalars(s, tensorboard_scalars(row));
    if (every > 0 && s % every == 0 && s != d.steps) saved_step = (save(s), s);
    out.flush();  // the lines are read by watchers while the run goes on
    if (opts.after_step) opts.after_step(s);
    if (any_rank(comm, sigterm_requested())) preempt = true;  // every rank stops after the same step
    if (preempt && s != d.steps) break;
  }

  {
    // One line (rank 0) of distributed facts: bytes each rank sent per step against the all-reduce
    // minimum 2(N-1)/N x 4 bytes x params (which zero3 with a whole-model gather per step also needs:
    // all-gather + reduce-scatter), persistent params+grads+moments per rank, peak transient buffers,
    // and the resident set size after the last step's update.
    const double steps_run = static_cast<double>(std::max<int64_t>(1, res.last_step - start));
    const dist::MemoryStats ms = master.memory();
    double mine[4] = {static_cast<double>(comm.stats().total()) / steps_run,
                      static_cast<double>(ms.persistent_bytes), static_cast<double>(ms.peak_transient_bytes),
                      rss_between_steps};
    std::vector<double> all(4 * static_cast<size_t>(world));
    comm.all_gather(mine, all.data(), 4);
    double P = 0, P_ends = 0;  // all parameters; those of the first and last unit (gathered once per leaf)
    for (const auto& t : master.specs()) {
      P += static_cast<double>(t.numel());
      if (t.unit == 0 || t.unit == master.units() - 1) P_ends += static_cast<double>(t.numel());
    }
    // Minimum bytes per rank per step: all-reduce (dp) = reduce-scatter + all-gather = 2(N-1)/N x 4P; zero3
    // whole-model: the same; zero3 per layer: the forward and backward all-gathers of every leaf + one
    // reduce-scatter = (N-1)/N x 4 x (leaves_per_rank x (2P - P_ends) + P).
    const double f = 4.0 * (world - 1) / world;
    const double min_bytes =
        shards.per_layer() ? f * (static_cast<double>(ga) * (2 * P - P_ends) + P) : 2 * f * P;
    auto per_rank = [&](size_t k) {
      std::vector<double> v;
      for (size_t i = k; i < all.size(); i += 4) v.push_back(all[i]);
      return v;
    };
    DistLine dl;
    dl.mode = dist::mode_name(mode);
    dl.processes = world;
    dl.comm = comm.name();
    dl.gather = mode == dist::ShardMode::Replicated ? "none"
                : shards.per_layer()                ? "per-layer"
                                                    : "whole-model";
    dl.params = static_cast<int64_t>(P);
    dl.sent_bytes_per_step_per_rank = per_rank(0);
    dl.minimum_bytes = min_bytes;
    dl.persistent_bytes_per_rank = per_rank(1);
    dl.peak_transient_bytes_per_rank = per_rank(2);
    dl.rss_bytes_per_rank = per_rank(3);
    out << format_dist(dl) << "\n";
  }
  if (stop_code == kExitNonFinite || stop_code == kExitStepGuard) {
    if (stop_code == kExitStepGuard) {
      out << "STEP-GUARD: step " << d.steps << " never completed (last completed step " << res.last_step
          << "): " << stop_reason << "\n";
    }
    res.exit_code = stop_code;
    res.reason = stop_reason;
    shards.finish();  // the model keeps the weights of the last applied step
    return res;
  }
  preempt = preempt || any_rank(comm, sigterm_requested());
  if (preempt && res.last_step < d.steps) {
    auto t0 = Clock::now();
    if (saved_step != res.last_step) saved_step = (save(res.last_step), res.last_step);
    double took = seconds_since(t0);
    if (took > grace)
      err << "WARNING: the preemption checkpoint took " << took << " s > grace " << grace << " s\n";
    out << "PREEMPTED: SIGTERM; checkpoint of step " << res.last_step << " written; exit " << kExitPreempted
        << " (restart to resume)\n";
    res.exit_code = kExitPreempted;
    res.reason = "preempted (SIGTERM) after step " + std::to_string(res.last_step);
    shards.finish();
    return res;
  }
  if (res.last_step < d.steps) {
    out << "STEP-GUARD: step " << d.steps << " never completed (last completed step " << res.last_step
        << ")\n";
    res.exit_code = kExitStepGuard;
    res.reason = "fewer steps than asked";
    shards.finish();
    return res;
  }
  if (saved_step != d.steps) saved_step = (save(d.steps), d.steps);
  shards.finish();            // collective: every rank's model holds the final weights
  if (rank != 0) return res;  // the end-of-run checks and the export are rank 0's
  out << "STEP-GUARD: reached step " << d.steps << (start == d.steps ? " (already, in the checkpoint)" : "")
      << "\n";
  if (stalled > 0) out << "STALLED steps=" << stalled << " (step time > 3x the running median)\n";

  // ---- end-of-run checks ----
  int64_t eos_targets = 0, trained_targets = 0;
  for (int64_t s = 1; s <= d.steps; ++s) {
    for (const RowRef& r : order.step_rows(s, 0, 1)) {
      PackedRow pr = ds.row(r.epoch, r.index);
      std::vector<int32_t> tg = pr.targets(-100);
      for (int32_t t : tg) {
        trained_targets += t != -100;
        eos_targets += t == eos_id;
      }
    }
  }
  bool checks_ok = eos_targets > 0;
  out << format_check_trained_eos({eos_targets, trained_targets, eos_id, checks_ok}) << "\n";
  if (!heldout.empty() && eos_id >= 0) {
    EvalCe ec;
    auto [p, n] = p_eos(model, ds, heldout, eos_id, lc, &ec);
    auto before = carried.value("p_eos_before", nlohmann::json(nullptr));
    CheckPEosLine pl{static_cast<int64_t>(heldout.size()), truly_heldout, n, std::nullopt, std::nullopt};
    if (before.is_number()) pl.before = before.get<double>();
    if (std::isfinite(p)) pl.after = p;
    out << format_check_p_eos(pl) << "\n";
    CheckEvalCeLine el{static_cast<int64_t>(heldout.size()), ec.targets, std::nullopt,
                       static_cast<int64_t>(heldout.front().index),
                       static_cast<int64_t>(heldout.back().index) + 1};
    if (ec.targets > 0) el.ce = ec.ce_sum / static_cast<double>(ec.targets);
    out << format_check_eval_ce(el) << "\n";
  }
  if (carried.contains("step1_ce")) out << format_check_step1_ce({carried["step1_ce"].get<double>()}) << "\n";

  if (cfg.export_.hf) {
    std::string hf = run_dir + "/hf";
    if (fs::exists(hf)) fs::remove_all(hf);
    std::string side = tok_spec.rfind("builtin:", 0) == 0 ? "" : tok_spec;
    if (opts.export_hf) {
      opts.export_hf(hf, model, side);
    } else {
      std::vector<safetensors::NamedTensor> named;
      for (const auto& p : params) named.push_back({p.name, p.value});
      model::ExportOptions eo;
      eo.copy_side_files_from = side;
      model::export_hf_dir(hf, model.config(), named, eo);
    }
    out << "EXPORT hf=" << hf << "\n";
  }
  if (!checks_ok) {
    res.exit_code = kExitCheckFailed;
    res.reason = "no trained EOS target in the data seen";
  }
  return res;
}

}  // namespace olmosft::train
