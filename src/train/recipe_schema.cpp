// The recipe schema: the one list of the trainer's recipe keys. Each entry binds a key to its TrainConfig
// field, its type, default, documentation, whether a resumed run may change it, and its validation; parsing,
// `olmosft recipe keys`, `recipe show`, the resume diff and the error texts all read this table
// (train/recipe.h). The `cluster.*` keys are the k8s launcher's table of the same rows (RecipeKeyDoc), in
// cluster/recipe_keys.cpp (cluster depends on train, not the reverse); `recipe keys` lists both.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <ostream>
#include <sstream>

#include "core/error.h"
#include "train/recipe.h"

namespace olmosft {

namespace {

// The field a key reads into, e.g. OLMOSFT_FIELD(batch.steps).
#define OLMOSFT_FIELD(member) \
  [](TrainConfig & c) -> auto& { return c.member; }

constexpr OnResume kMath = OnResume::Math, kOps = OnResume::Operational;

template <typename Get>
RecipeKey text_key(const char* name, const char* def, const char* doc, OnResume r, Get get) {
  return {name, KeyType::String,
          def,  doc,
          r,    [get](TrainConfig& c, const std::string& v, const std::string&) { get(c) = v; }};
}

// A string with a fixed set of values: "SRC: KEY: expected a, b or c, got 'v'".
template <typename Get>
RecipeKey choice_key(const char* name, const char* def, const char* doc, OnResume r,
                     std::vector<std::string> choices, Get get) {
  return {name,
          KeyType::String,
          def,
          doc,
          r,
          [name, choices, get](TrainConfig& c, const std::string& v, const std::string& src) {
            if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
              std::string list;
              for (size_t i = 0; i < choices.size(); ++i)
                list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
              fail(src, ": ", name, ": expected ", list, ", got '", v, "'");
            }
            get(c) = v;
          }};
}

// An integer >= lo: "SRC: KEY must be >= lo (why), got v".
template <typename Get>
RecipeKey int_key(const char* name, const char* def, const char* doc, OnResume r, int64_t lo, const char* why,
                  Get get) {
  return {name,
          KeyType::Int,
          def,
          doc,
          r,
          [name, lo, why, get](TrainConfig& c, const std::string& v, const std::string& src) {
            const int64_t x = std::stoll(v);
            if (x < lo)
              fail(src, ": ", name, " must be >= ", lo, why[0] ? " (" : "", why, why[0] ? ")" : "", ", got ",
                   x);
            get(c) = x;
          }};
}

// A number in a range, each end open or closed (infinite: unbounded): "SRC: KEY must be in [lo, hi), got v".
struct Range {
  double lo = -INFINITY;
  bool lo_open = false;
  double hi = INFINITY;
  bool hi_open = false;
  std::string text() const {
    std::ostringstream s;
    if (std::isinf(hi)) {
      s << (lo_open ? "> " : ">= ") << lo;
    } else {
      s << "in " << (lo_open ? "(" : "[") << lo << ", " << hi << (hi_open ? ")" : "]");
    }
    return s.str();
  }
  bool holds(double x) const { return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi); }
};
constexpr Range kPositive{0, true}, kNonNegative{0, false}, kUnitOpen{0, false, 1, true},
    kUnitClosed{0, false, 1, false};

template <typename Get>
RecipeKey number_key(const char* name, const char* def, const char* doc, OnResume r, Range range, Get get) {
  return {name,
          KeyType::Float,
          def,
          doc,
          r,
          [name, range, get](TrainConfig& c, const std::string& v, const std::string& src) {
            const double x = std::stod(v);
            if (!range.holds(x)) fail(src, ": ", name, " must be ", range.text(), ", got ", x);
            get(c) = x;
          }};
}

template <typename Get>
RecipeKey flag_key(const char* name, const char* def, const char* doc, OnResume r, Get get) {
  return {name, KeyType::Bool,
          def,  doc,
          r,    [get](TrainConfig& c, const std::string& v, const std::string&) { get(c) = v == "true"; }};
}

// run_name: one directory under output_dir: not empty, no path separator, not . or .. (run_name=../x
// escaped it).
void read_run_name(TrainConfig& c, const std::string& v, const std::string& src) {
  const bool ok = !v.empty() && v != "." && v != ".." && std::all_of(v.begin(), v.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
  });
  OLMO_CHECK(ok, src, ": run_name '", v,
             "' must be one directory name under output_dir: letters, digits, '-', '_' and '.', not empty, "
             "not . or ..");
  c.run_name = v;
}

std::vector<RecipeKey> run_keys() {
  return {
      {"run_name", KeyType::String, "run", "name of the run; checkpoints go to output_dir/run_name", kMath,
       read_run_name},
      {"output_dir", KeyType::String, "runs", "directory holding one folder per run", kMath,
       [](TrainConfig& c, const std::string& v, const std::string& src) {
         OLMO_CHECK(!v.empty(), src, ": output_dir must not be empty");
         c.output_dir = v;
       }},
      int_key("seed", "0", "seed for initialisation and any sampling (data order is fixed by the dataset)",
              kMath, INT64_MIN, "", OLMOSFT_FIELD(seed)),
      text_key("model.init", "",
               "HF model directory to fine-tune (config.json + safetensors), or an OLMo-core step directory "
               "(model_and_optim/ distributed checkpoint + config.json)",
               kMath, OLMOSFT_FIELD(model.init)),
      text_key("model.config", "", "config.json for a randomly initialised model (when model.init is empty)",
               kMath, OLMOSFT_FIELD(model.config)),
      {"model.remat", KeyType::String, "none",
       "activation recomputation: none (keep every layer's activations), full (keep each block's input and "
       "re-run its forward in the backward) or attn (re-run only the attention / KDA mixers); bit-identical",
       kOps,
       [](TrainConfig& c, const std::string& v, const std::string& src) {
         c.model.memory.remat = model::parse_remat(v, src + ": model.remat");
       }},
      {"model.saved_dtype", KeyType::String, "fp32",
       "dtype of the activations kept for the backward: fp32 or bf16 (about half of them; not with "
       "model.remat=full; changes the gradients by bf16 rounding)",
       kMath,
       [](TrainConfig& c, const std::string& v, const std::string& src) {
         c.model.memory.saved = model::parse_saved_dtype(v, src + ": model.saved_dtype");
       }},
      choice_key(
          "device", "cpu",
          "compute backend: cpu (the CPU kernels), xla (the same decoder emitted as StableHLO and run by "
          "the PJRT plugin xla.plugin; docs/xla.md), or cuda (refused: GPUs train "
          "with device: xla and xla.plugin: cuda)",
          kMath, {"cpu", "xla", "cuda"}, OLMOSFT_FIELD(device)),
      text_key(
          "xla.plugin", "cpu",
          "device: xla: the PJRT plugin, cpu (XLA's CPU plugin, installed by scripts/install-deps.sh), cuda "
          "($OLMOSFT_PJRT_CUDA), tpu ($OLMOSFT_PJRT_TPU) or a plugin .so path",
          kMath, OLMOSFT_FIELD(xla.plugin)),
      choice_key(
          "xla.attention", "blockwise",
          "device: xla: blockwise (the attention every plugin runs: packed documents, padding, windows) "
          "or cudnn (cuDNN's fused attention as custom calls: xla.plugin cuda only, bf16 operands; "
          "docs/xla.md)",
          kMath, {"blockwise", "cudnn"}, OLMOSFT_FIELD(xla.attention)),
      int_key("xla.delta_chunk", "64",
              "device: xla: tokens per chunk of the KDA / Gated DeltaNet chunked delta rule (a loop over "
              "chunks carrying the state); 0: the token-by-token recurrence (the exact reference, a loop "
              "over tokens); docs/xla.md \"The delta rule on XLA\"",
              kMath, 0, "", OLMOSFT_FIELD(xla.delta_chunk)),
      int_key("xla.cpu_devices", "1",
              "device: xla with xla.plugin cpu: devices XLA's CPU plugin creates (at least xla.devices)",
              kOps, 1, "", OLMOSFT_FIELD(xla.cpu_devices)),
      int_key("xla.devices", "1",
              "device: xla: the older spelling of mesh.data (or, with xla.shard_params, mesh.fsdp): the "
              "plugin's devices each process trains on as one SPMD program, each micro-batch's rows split "
              "over them; with mesh.* given it must be 1 or their product; docs/xla.md \"The device mesh\"",
              kMath, 1, "", OLMOSFT_FIELD(xla.devices)),
      flag_key(
          "xla.shard_params", "false",
          "device: xla: with xla.devices N, the mesh {fsdp: N} (parameters, gradient sums and AdamW moments "
          "split) instead of {data: N}; refused with mesh.* (which splits them over fsdp x expert x context)",
          kMath, OLMOSFT_FIELD(xla.shard_params)),
      flag_key("xla.scan_layers", "false",
               "device: xla: each run of repeating layers emitted once, as a loop over its stacked weights "
               "(program "
               "size and compile time flat in depth; needs model.remat full); docs/xla.md",
               kMath, OLMOSFT_FIELD(xla.scan_layers)),
      number_key(
          "xla.memory_limit_gib", "0",
          "device: xla: the memory per device a compiled program (with the AdamW moments beside it) must "
          "fit, else the run is refused before it runs; 0: the device's own limit as its plugin reports "
          "it (none for XLA's CPU plugin: no check); docs/xla.md \"Memory\"",
          kOps, kNonNegative, OLMOSFT_FIELD(xla.memory_limit_gib)),
      text_key("tokenizer", "", "HF tokenizer directory; must match the one the dataset was built with",
               kMath, OLMOSFT_FIELD(tokenizer)),
      text_key("data.path", "", "packed dataset directory written by `olmosft data build`", kMath,
               OLMOSFT_FIELD(data.path)),
      int_key("data.epochs", "1", "passes over the dataset the run may use; more steps than that is an error",
              kMath, 1, "", OLMOSFT_FIELD(data.epochs)),
  };
}

std::vector<RecipeKey> batch_keys() {
  return {
      int_key("seq_len", "4096", "tokens per packed row; must equal the dataset's", kMath, 2, "",
              OLMOSFT_FIELD(batch.seq_len)),
      int_key("global_batch", "16", "rows per optimizer step, over all devices and accumulation steps", kMath,
              1, "", OLMOSFT_FIELD(batch.global_batch)),
      number_key("per_device_batch", "1", "rows per device per micro-step (fractional: a row spans devices)",
                 kOps, kPositive, OLMOSFT_FIELD(batch.per_device_batch)),
      int_key(
          "devices", "1",
          "devices taking part (CPU: processes; device xla: processes x xla.devices); under mpirun it must "
          "equal that (defaults to it)",
          kOps, 1, "", OLMOSFT_FIELD(batch.devices)),
      choice_key("dist.mode", "dp",
                 "multi-process mode: dp (replicated weights, all-reduced gradients) or zero3 (weights, "
                 "gradients and AdamW moments sharded 1/N)",
                 kOps, {"dp", "zero3"}, OLMOSFT_FIELD(dist.mode)),
      choice_key(
          "dist.gather", "layer",
          "zero3: all-gather weights per layer (forward and backward of every micro-batch; Olmo 3 dense) "
          "or per step (the whole model once per step: less traffic with several micro-batches per rank, "
          "more memory)",
          kOps, {"layer", "step"}, OLMOSFT_FIELD(dist.gather)),
      int_key("steps", "0", "optimizer steps to train (required); the run fails if it completes fewer", kMath,
              1, "a run that trains zero steps is an error", OLMOSFT_FIELD(batch.steps)),
      int_key("lr_schedule_steps", "0", "LR schedule horizon; 0 means `steps`", kMath, 0, "0 = steps",
              OLMOSFT_FIELD(batch.schedule_steps)),
  };
}

std::vector<RecipeKey> optimizer_keys() {
  return {
      number_key("optimizer.lr", "5e-5", "peak learning rate", kMath, kPositive, OLMOSFT_FIELD(optimizer.lr)),
      choice_key("optimizer.schedule", "linear", "linear (warmup then linear to final) or constant", kMath,
                 {"linear", "constant"}, OLMOSFT_FIELD(optimizer.schedule)),
      number_key("optimizer.warmup_frac", "0.03", "warmup as a fraction of the schedule horizon", kMath,
                 kUnitOpen, OLMOSFT_FIELD(optimizer.warmup_frac)),
      number_key("optimizer.final_lr_frac", "0.0", "LR at the horizon, as a fraction of the peak", kMath,
                 kUnitClosed, OLMOSFT_FIELD(optimizer.final_lr_frac)),
      number_key("optimizer.beta1", "0.9", "AdamW beta1", kMath, kUnitOpen, OLMOSFT_FIELD(optimizer.beta1)),
      number_key("optimizer.beta2", "0.95", "AdamW beta2", kMath, kUnitOpen, OLMOSFT_FIELD(optimizer.beta2)),
      number_key("optimizer.eps", "1e-8", "AdamW epsilon", kMath, kPositive, OLMOSFT_FIELD(optimizer.eps)),
      number_key("optimizer.weight_decay", "0.0", "AdamW decoupled weight decay", kMath, kNonNegative,
                 OLMOSFT_FIELD(optimizer.weight_decay)),
      number_key("optimizer.clip_grad_norm", "1.0", "global-norm clipping threshold, applied before Adam",
                 kMath, kNonNegative, OLMOSFT_FIELD(optimizer.clip_grad_norm)),
  };
}

// The loss terms' weight keys, from the term list (model/loss_terms.h), then the MoE capacity.
std::vector<RecipeKey> loss_keys() {
  std::vector<RecipeKey> keys;
  for (size_t t = 0; t < model::kLossTermCount; ++t) {
    const model::LossTerm& term = model::kLossTerms[t];
    if (term.weight_key == nullptr) continue;
    keys.push_back(number_key(term.weight_key, term.weight_default, term.weight_doc, kMath, kNonNegative,
                              [t](TrainConfig& c) -> double& { return c.loss.weight[t]; }));
  }
  keys.push_back({"moe.buffer_factor", KeyType::Float, "-1",
                  "expert capacity as a multiple of the balanced load; -1 = dropless", kMath,
                  [](TrainConfig& c, const std::string& v, const std::string& src) {
                    const double x = std::stod(v);
                    OLMO_CHECK(x == -1 || x >= 1, src,
                               ": moe.buffer_factor must be -1 (dropless) or >= 1, got ", x);
                    c.moe.buffer_factor = x;
                  }});
  return keys;
}

std::vector<RecipeKey> compute_keys() {
  return {
      int_key("compute.vocab_tile", "8192", "vocabulary chunk for the tiled cross-entropy (0 = untiled)",
              kMath, 0, "", OLMOSFT_FIELD(compute.vocab_tile)),
      int_key("compute.threads", "0", "CPU threads (0 = all cores)", kOps, 0, "0 = all cores",
              OLMOSFT_FIELD(compute.threads)),
      {"compute.dtype", KeyType::String, "fp32",
       "CPU weight GEMMs' operands: fp32, or bf16 (rounded to bf16, products summed in fp32 by oneDNN; "
       "weights, gradients and optimizer state stay fp32)",
       kMath,
       [](TrainConfig& c, const std::string& v, const std::string& src) {
         c.compute.gemm.compute = parse_compute_dtype(v, src + ": compute.dtype");
       }},
      {"compute.gemm", KeyType::String, "auto",
       "CPU fp32 GEMM library: auto (this machine's measured choice, `olmosft selfcheck` prints it), "
       "openblas or onednn",
       kMath,
       [](TrainConfig& c, const std::string& v, const std::string& src) {
         c.compute.gemm.fp32 = parse_gemm_lib(v, src + ": compute.gemm");
       }},
  };
}

std::vector<RecipeKey> run_control_keys() {
  return {
      int_key("checkpoint.every", "0", "save every N steps (0 = only the final and preemption saves)", kOps,
              0, "", OLMOSFT_FIELD(checkpoint.every)),
      int_key("checkpoint.keep_last", "3", "checkpoints to keep (older ones are deleted after a save)", kOps,
              1, "", OLMOSFT_FIELD(checkpoint.keep_last)),
      int_key("checkpoint.grace_seconds", "120", "budget to write a checkpoint after SIGTERM (preemption)",
              kOps, 1, "", OLMOSFT_FIELD(checkpoint.grace_seconds)),
      flag_key("checkpoint.resume", "true", "resume from the latest valid checkpoint in the run directory",
               kOps, OLMOSFT_FIELD(checkpoint.resume)),
      flag_key("checkpoint.allow_recipe_change", "false",
               "resume even when keys that change the run's numbers (data, model, optimizer, losses, batch, "
               "steps) differ from the checkpoint's recipe; the differences are printed either way",
               kOps, OLMOSFT_FIELD(checkpoint.allow_recipe_change)),
      number_key("guard.grad_norm_spike", "1000",
                 "stop (exit 4, last good step checkpointed, the update not applied) when a step's gradient "
                 "norm exceeds this many times the median of the last 64 steps' norms; 0 = off",
                 kOps, kNonNegative, OLMOSFT_FIELD(guard.grad_norm_spike)),
      int_key("log.every", "1", "log a LOSS-PARTS line every N steps", kOps, 1, "", OLMOSFT_FIELD(log.every)),
      flag_key("log.tensorboard", "true", "write TensorBoard event files next to metrics.jsonl", kOps,
               OLMOSFT_FIELD(log.tensorboard)),
      int_key("eval.heldout", "32",
              "rows for the P(EOS) check before and after training (untrained rows of epoch 0 when there are "
              "any)",
              kOps, 0, "", OLMOSFT_FIELD(eval.heldout)),
      flag_key("export.hf", "true", "export the final weights as an HF directory into RUN_DIR/hf", kOps,
               OLMOSFT_FIELD(export_.hf)),
      number_key("perf.peak_tflops", "0",
                 "peak fp32 TFLOP/s per process for MFU (0 = measure an SGEMM at the run's first start; kept "
                 "in RUN_DIR/peak_flops.json for resumes)",
                 kOps, kNonNegative, OLMOSFT_FIELD(perf.peak_tflops)),
  };
}

#undef OLMOSFT_FIELD

}  // namespace

const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::String:
      return "string";
    case KeyType::Int:
      return "int";
    case KeyType::Float:
      return "float";
    case KeyType::Bool:
      return "bool";
    case KeyType::List:
      return "list";
  }
  return "?";
}

void print_recipe_key(std::ostream& os, const RecipeKeyDoc& k) {
  os << k.name << " = " << (k.default_value.empty() ? "\"\"" : k.default_value) << "  # "
     << key_type_name(k.type) << ": " << k.doc << "\n";
}

const std::vector<RecipeKey>& recipe_keys() {
  static const std::vector<RecipeKey> keys = [] {
    std::vector<RecipeKey> all;
    for (auto part : {run_keys, batch_keys, optimizer_keys, loss_keys, compute_keys, run_control_keys}) {
      auto k = part();
      all.insert(all.end(), std::make_move_iterator(k.begin()), std::make_move_iterator(k.end()));
    }
    return all;
  }();
  return keys;
}

const RecipeKey* find_recipe_key(const std::string& name) {
  for (const auto& k : recipe_keys())
    if (k.name == name) return &k;
  return nullptr;
}

bool recipe_key_operational(const std::string& key) {
  if (key.rfind("cluster.", 0) == 0 || key.rfind("mesh.", 0) == 0) return true;  // the launcher's sections
  const RecipeKey* k = find_recipe_key(key);
  return k != nullptr && k->on_resume == OnResume::Operational;
}

}  // namespace olmosft
