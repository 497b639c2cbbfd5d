#include "train/recipe.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "core/error.h"

namespace olmosft {

const std::vector<RecipeKey>& recipe_keys() {
  static const std::vector<RecipeKey> keys = {
      {"run_name", KeyType::String, "run", "name of the run; checkpoints go to output_dir/run_name"},
      {"output_dir", KeyType::String, "runs", "directory holding one folder per run"},
      {"seed", KeyType::Int, "0",
       "seed for initialisation and any sampling (data order is fixed by the dataset)"},
      {"model.init", KeyType::String, "",
       "HF model directory to fine-tune (config.json + safetensors), or an OLMo-core step directory "
       "(model_and_optim/ distributed checkpoint + config.json)"},
      {"model.config", KeyType::String, "",
       "config.json for a randomly initialised model (when model.init is empty)"},
      {"model.remat", KeyType::String, "none",
       "activation recomputation: none (keep every layer's activations), full (keep each block's input and "
       "re-run its forward in the backward) or attn (re-run only the attention / KDA mixers); bit-identical"},
      {"model.saved_dtype", KeyType::String, "fp32",
       "dtype of the activations kept for the backward: fp32 or bf16 (about half of them; not with "
       "model.remat=full; changes the gradients by bf16 rounding)"},
      {"device", KeyType::String, "cpu",
       "compute device: cpu, or cuda (NVIDIA GPUs; this build has no CUDA training backend yet, issue #15, "
       "and refuses it before any compute)"},
      {"tokenizer", KeyType::String, "",
       "HF tokenizer directory; must match the one the dataset was built with"},
      {"data.path", KeyType::String, "", "packed dataset directory written by `olmosft data build`"},
      {"data.epochs", KeyType::Int, "1",
       "passes over the dataset the run may use; more steps than that is an error"},
      {"seq_len", KeyType::Int, "4096", "tokens per packed row; must equal the dataset's"},
      {"global_batch", KeyType::Int, "16",
       "rows per optimizer step, over all devices and accumulation steps"},
      {"per_device_batch", KeyType::Float, "1",
       "rows per device per micro-step (fractional: a row spans devices)"},
      {"devices", KeyType::Int, "1",
       "devices taking part (CPU: processes; TPU: chips); under mpirun it must equal -np (defaults to it)"},
      {"dist.mode", KeyType::String, "dp",
       "multi-process mode: dp (replicated weights, all-reduced gradients) or zero3 (weights, gradients and "
       "AdamW moments sharded 1/N)"},
      {"dist.gather", KeyType::String, "layer",
       "zero3: all-gather weights per layer (forward and backward of every micro-batch; Olmo 3 dense) or per "
       "step (the whole model once per step: less traffic with several micro-batches per rank, more memory)"},
      {"steps", KeyType::Int, "0",
       "optimizer steps to train (required); the run fails if it completes fewer"},
      {"lr_schedule_steps", KeyType::Int, "0", "LR schedule horizon; 0 means `steps`"},
      {"optimizer.lr", KeyType::Float, "5e-5", "peak learning rate"},
      {"optimizer.schedule", KeyType::String, "linear", "linear (warmup then linear to final) or constant"},
      {"optimizer.warmup_frac", KeyType::Float, "0.03", "warmup as a fraction of the schedule horizon"},
      {"optimizer.final_lr_frac", KeyType::Float, "0.0", "LR at the horizon, as a fraction of the peak"},
      {"optimizer.beta1", KeyType::Float, "0.9", "AdamW beta1"},
      {"optimizer.beta2", KeyType::Float, "0.95", "AdamW beta2"},
      {"optimizer.eps", KeyType::Float, "1e-8", "AdamW epsilon"},
      {"optimizer.weight_decay", KeyType::Float, "0.0", "AdamW decoupled weight decay"},
      {"optimizer.clip_grad_norm", KeyType::Float, "1.0",
       "global-norm clipping threshold, applied before Adam"},
      {"loss.lm_z", KeyType::Float, "1e-5",
       "LM-head z-loss coefficient (x mean logsumexp^2 over trained tokens)"},
      {"loss.moe_lb", KeyType::Float, "0.01", "MoE load-balance loss coefficient, per MoE layer, summed"},
      {"loss.router_z", KeyType::Float, "1e-5", "MoE router z-loss coefficient, per MoE layer, summed"},
      {"moe.buffer_factor", KeyType::Float, "-1",
       "expert capacity as a multiple of the balanced load; -1 = dropless"},
      {"compute.vocab_tile", KeyType::Int, "8192",
       "vocabulary chunk for the tiled cross-entropy (0 = untiled)"},
      {"compute.threads", KeyType::Int, "0", "CPU threads (0 = all cores)"},
      {"compute.dtype", KeyType::String, "fp32",
       "CPU weight GEMMs' operands: fp32, or bf16 (rounded to bf16, products summed in fp32 by oneDNN; "
       "weights, gradients and optimizer state stay fp32)"},
      {"compute.gemm", KeyType::String, "auto",
       "CPU fp32 GEMM library: auto (this machine's measured choice, `olmosft selfcheck` prints it), "
       "openblas or onednn"},
      {"checkpoint.every", KeyType::Int, "0", "save every N steps (0 = only the final and preemption saves)"},
      {"checkpoint.keep_last", KeyType::Int, "3",
       "checkpoints to keep (older ones are deleted after a save)"},
      {"checkpoint.grace_seconds", KeyType::Int, "120",
       "budget to write a checkpoint after SIGTERM (preemption)"},
      {"checkpoint.resume", KeyType::Bool, "true",
       "resume from the latest valid checkpoint in the run directory"},
      {"checkpoint.allow_recipe_change", KeyType::Bool, "false",
       "resume even when keys that change the run's numbers (data, model, optimizer, losses, batch, steps) "
       "differ from the checkpoint's recipe; the differences are printed either way"},
      {"log.every", KeyType::Int, "1", "log a LOSS-PARTS line every N steps"},
      {"log.tensorboard", KeyType::Bool, "true", "write TensorBoard event files next to metrics.jsonl"},
      {"eval.heldout", KeyType::Int, "32",
       "rows for the P(EOS) check before and after training (untrained rows of epoch 0 when there are any)"},
      {"export.hf", KeyType::Bool, "true", "export the final weights as an HF directory into RUN_DIR/hf"},
      {"perf.peak_tflops", KeyType::Float, "0",
       "peak fp32 TFLOP/s per process for MFU (0 = measure an SGEMM at the run's first start; kept in "
       "RUN_DIR/peak_flops.json for resumes)"},
  };
  return keys;
}

namespace {

const RecipeKey* find_key(const std::string& name) {
  for (const auto& k : recipe_keys()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

// Sections read by other tools and passed through verbatim: `cluster.*` (the k8s launcher, validated
// there) and `mesh.*` (accelerator mesh axes, checked against the slice by the launcher).
bool passthrough(const std::string& name) {
  return name.rfind("cluster.", 0) == 0 || name.rfind("mesh.", 0) == 0;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_key(const std::string& name) {
  std::string best;
  size_t bd = SIZE_MAX;
  for (const auto& k : recipe_keys()) {
    // compare against the full name and its last component, so "lr" suggests "optimizer.lr"
    std::string last = k.name.substr(k.name.rfind('.') + 1);
    size_t d = std::min(edit_distance(name, k.name), edit_distance(name, last));
    if (d < bd) {
      bd = d;
      best = k.name;
    }
  }
  return best;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

void check_value(const RecipeKey& k, const std::string& v, const std::string& origin) {
  auto bad = [&](const char* what) {
    fail(origin, ": key '", k.name, "' expects ", what, ", got '", v, "' (", k.doc, ")");
  };
  switch (k.type) {
    case KeyType::String:
      return;
    case KeyType::Int: {
      size_t pos = 0;
      try {
        (void)std::stoll(v, &pos);
      } catch (...) {
        bad("an integer");
      }
      if (pos != v.size()) bad("an integer");
      return;
    }
    case KeyType::Float: {
      size_t pos = 0;
      double d = 0;
      try {
        d = std::stod(v, &pos);
      } catch (...) {
        bad("a number");
      }
      if (pos != v.size() || !std::isfinite(d)) bad("a finite number");
      return;
    }
    case KeyType::Bool:
      if (v != "true" && v != "false") bad("true or false");
      return;
  }
}

// Nested maps to dotted keys. A key given twice (the same key twice in one map, or `a.b:` beside `a: {b:}`)
// is an error naming both lines: YAML parsers differ on which one wins, and a recipe must say one thing.
void flatten(const YAML::Node& node, const std::string& prefix, const std::string& source,
             std::vector<std::pair<std::string, std::string>>& out, std::map<std::string, int>& lines) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      // A complex key (`? [a]` or `{a: 1}: 2`) has no dotted name; as<std::string>() threw yaml-cpp's
      // BadConversion, which escaped as a non-olmosft error.
      if (!kv.first.IsScalar())
        fail(source, ": line ", kv.first.Mark().line + 1,
             ": a key must be a plain name, not a list or a map");
      std::string key = kv.first.as<std::string>();
      const std::string full = prefix.empty() ? key : prefix + "." + key;
      const int line = kv.first.Mark().line + 1;
      auto [it, fresh] = lines.emplace(full, line);
      if (!fresh)
        fail(source, ": key '", full, "' is given twice (lines ", it->second, " and ", line,
             "); keep one of them");
      flatten(kv.second, full, source, out, lines);
    }
  } else if (node.IsScalar()) {
    out.emplace_back(prefix, node.as<std::string>());
  } else if (node.IsNull()) {
    out.emplace_back(prefix, "");
  } else if (node.IsSequence() && passthrough(prefix)) {
    out.emplace_back(prefix, YAML::Dump(node));
  } else {
    fail(source, ": key '", prefix, "' must be a single value, not a list");
  }
}

}  // namespace

void Recipe::set(const std::string& key, const std::string& value, const std::string& origin) {
  if (passthrough(key)) {
    values_[key] = value;
    return;
  }
  const RecipeKey* k = find_key(key);
  if (!k) fail(origin, ": unknown recipe key '", key, "' (did you mean '", closest_key(key), "'?)");
  check_value(*k, value, origin);
  values_[key] = value;
}

Recipe Recipe::parse(const std::string& text, const std::string& source,
                     const std::vector<std::string>& overrides) {
  Recipe r;
  r.source_ = source;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(source, ": not valid YAML: ", e.what());
  }
  if (!root.IsNull()) {
    if (!root.IsMap()) fail(source, ": a recipe must be a YAML mapping of keys to values");
    std::vector<std::pair<std::string, std::string>> flat;
    std::map<std::string, int> lines;
    flatten(root, "", source, flat, lines);
    for (const auto& [k, v] : flat) r.set(k, v, source);
  }
  for (const auto& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) fail("override '", o, "': expected key=value");
    r.set(trim(o.substr(0, eq)), trim(o.substr(eq + 1)), "override '" + o + "'");
  }
  return r;
}

Recipe Recipe::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) fail("recipe ", path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path, overrides);
}

std::string Recipe::str(const std::string& key) const {
  auto it = values_.find(key);
  if (it != values_.end()) return it->second;
  const RecipeKey* k = find_key(key);
  OLMO_CHECK(k != nullptr, "internal: recipe key '", key, "' is not declared");
  return k->default_value;
}

int64_t Recipe::i64(const std::string& key) const { return std::stoll(str(key)); }
double Recipe::f64(const std::string& key) const { return std::stod(str(key)); }
bool Recipe::flag(const std::string& key) const { return str(key) == "true"; }

void Recipe::set_default(const std::string& key, const std::string& value, const std::string& origin) {
  if (values_.count(key) == 0) set(key, value, origin);
}

void Recipe::write_yaml(std::ostream& os) const {
  for (const auto& k : recipe_keys()) {
    std::string v = str(k.name);
    os << k.name << ": " << (v.empty() ? "\"\"" : v) << "  # " << (values_.count(k.name) ? "" : "default; ")
       << k.doc << "\n";
  }
  for (const auto& [k, v] : values_) {
    if (passthrough(k)) os << k << ": " << v << "\n";
  }
}

TrainConfig Recipe::fields() const {
  TrainConfig c;
  const std::string& src = source_;
  c.source = src;
  std::ostringstream yaml;
  write_yaml(yaml);
  c.resolved_yaml = yaml.str();
  for (const auto& [k, v] : values_) c.given.insert(k);
  c.run_name = str("run_name");
  c.output_dir = str("output_dir");
  // One directory under output_dir: not empty, no path separator, not . or .. (run_name=../x escaped it).
  const bool name_ok =
      !c.run_name.empty() && c.run_name != "." && c.run_name != ".." &&
      std::all_of(c.run_name.begin(), c.run_name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
      });
  OLMO_CHECK(name_ok, src, ": run_name '", c.run_name,
             "' must be one directory name under output_dir: letters, digits, '-', '_' and '.', not empty, "
             "not . or ..");
  OLMO_CHECK(!c.output_dir.empty(), src, ": output_dir must not be empty");
  c.seed = i64("seed");
  c.device = str("device");
  OLMO_CHECK(c.device == "cpu" || c.device == "cuda", src, ": key 'device' expects cpu or cuda, got '",
             c.device, "'");
  c.tokenizer = str("tokenizer");
  c.model.init = str("model.init");
  c.model.config = str("model.config");
  c.model.memory.remat = model::parse_remat(str("model.remat"), src + ": model.remat");
  c.model.memory.saved = model::parse_saved_dtype(str("model.saved_dtype"), src + ": model.saved_dtype");
  OLMO_CHECK(
      !(c.model.memory.saved == model::SavedDtype::BF16 && c.model.memory.remat == model::Remat::Full), src,
      ": model.saved_dtype=bf16 does nothing under model.remat=full (full keeps only the block inputs, "
      "in fp32, so that the backward's re-run reproduces the forward); use model.remat=attn or none with "
      "bf16, or saved_dtype fp32 with full");
  c.data.path = str("data.path");
  c.data.epochs = i64("data.epochs");
  OLMO_CHECK(c.data.epochs >= 1, src, ": data.epochs must be >= 1");

  Derived& d = c.batch;
  d.global_batch = i64("global_batch");
  d.devices = i64("devices");
  d.per_device_batch = f64("per_device_batch");
  d.seq_len = i64("seq_len");
  d.steps = i64("steps");
  d.schedule_steps = i64("lr_schedule_steps");
  OLMO_CHECK(d.global_batch >= 1, src, ": global_batch must be >= 1, got ", d.global_batch);
  OLMO_CHECK(d.devices >= 1, src, ": devices must be >= 1, got ", d.devices);
  OLMO_CHECK(d.per_device_batch > 0, src, ": per_device_batch must be > 0, got ", d.per_device_batch);
  OLMO_CHECK(d.seq_len >= 2, src, ": seq_len must be >= 2, got ", d.seq_len);
  OLMO_CHECK(d.steps >= 1, src, ": steps must be >= 1 (a run that trains zero steps is an error), got ",
             d.steps);
  OLMO_CHECK(d.schedule_steps >= 0, src, ": lr_schedule_steps must be >= 1 or 0 (= steps), got ",
             d.schedule_steps);

  c.dist.mode = str("dist.mode");
  OLMO_CHECK(c.dist.mode == "dp" || c.dist.mode == "zero3", src, ": dist.mode must be dp or zero3, got '",
             c.dist.mode, "'");
  c.dist.gather = str("dist.gather");
  OLMO_CHECK(c.dist.gather == "layer" || c.dist.gather == "step", src,
             ": dist.gather must be layer or step, got '", c.dist.gather, "'");
  read_optimizer(c);

  c.loss.lm_z = f64("loss.lm_z");
  c.loss.moe_lb = f64("loss.moe_lb");
  c.loss.router_z = f64("loss.router_z");
  c.moe.buffer_factor = f64("moe.buffer_factor");
  OLMO_CHECK(c.moe.buffer_factor == -1 || c.moe.buffer_factor >= 1, src,
             ": moe.buffer_factor must be -1 (dropless) or >= 1, got ", c.moe.buffer_factor);
  c.compute.vocab_tile = i64("compute.vocab_tile");
  OLMO_CHECK(c.compute.vocab_tile >= 0, src, ": compute.vocab_tile must be >= 0");
  c.compute.threads = i64("compute.threads");
  c.compute.gemm.fp32 = parse_gemm_lib(str("compute.gemm"), src + ": compute.gemm");
  c.compute.gemm.compute = parse_compute_dtype(str("compute.dtype"), src + ": compute.dtype");

  c.checkpoint.every = i64("checkpoint.every");
  c.checkpoint.keep_last = i64("checkpoint.keep_last");
  c.checkpoint.grace_seconds = i64("checkpoint.grace_seconds");
  c.checkpoint.resume = flag("checkpoint.resume");
  c.checkpoint.allow_recipe_change = flag("checkpoint.allow_recipe_change");
  OLMO_CHECK(c.checkpoint.keep_last >= 1, src, ": checkpoint.keep_last must be >= 1");
  OLMO_CHECK(c.checkpoint.every >= 0, src, ": checkpoint.every must be >= 0");
  OLMO_CHECK(c.checkpoint.grace_seconds >= 1, src, ": checkpoint.grace_seconds must be >= 1");
  c.log.every = i64("log.every");
  OLMO_CHECK(c.log.every >= 1, src, ": log.every must be >= 1");
  c.log.tensorboard = flag("log.tensorboard");
  c.eval.heldout = i64("eval.heldout");
  OLMO_CHECK(c.eval.heldout >= 0, src, ": eval.heldout must be >= 0");
  c.export_.hf = flag("export.hf");
  c.perf.peak_tflops = f64("perf.peak_tflops");
  OLMO_CHECK(c.perf.peak_tflops >= 0, src, ": perf.peak_tflops must be >= 0 (0 = measure)");

  for (const auto& [k, v] : values_) {
    if (k.rfind("cluster.", 0) == 0) c.cluster[k.substr(8)] = v;
    if (k.rfind("mesh.", 0) != 0) continue;
    size_t pos = 0;
    int64_t n = 0;
    try {
      n = std::stoll(v, &pos);
    } catch (...) {
      pos = 0;
    }
    OLMO_CHECK(pos == v.size() && !v.empty() && n >= 1, src, ": key '", k,
               "' expects an integer >= 1 (devices along that mesh axis), got '", v, "'");
    c.mesh[k.substr(5)] = n;
  }
  return c;
}

void Recipe::read_optimizer(TrainConfig& c) const {
  const std::string& src = source_;
  TrainConfig::Optimizer& o = c.optimizer;
  o.schedule = str("optimizer.schedule");
  o.lr = f64("optimizer.lr");
  o.warmup_frac = f64("optimizer.warmup_frac");
  o.final_lr_frac = f64("optimizer.final_lr_frac");
  o.beta1 = f64("optimizer.beta1");
  o.beta2 = f64("optimizer.beta2");
  o.eps = f64("optimizer.eps");
  o.weight_decay = f64("optimizer.weight_decay");
  o.clip_grad_norm = f64("optimizer.clip_grad_norm");
  OLMO_CHECK(o.warmup_frac >= 0 && o.warmup_frac < 1, src, ": optimizer.warmup_frac must be in [0, 1), got ",
             o.warmup_frac);
  OLMO_CHECK(o.schedule == "linear" || o.schedule == "constant", src,
             ": optimizer.schedule must be linear or constant, got '", o.schedule, "'");
  OLMO_CHECK(o.final_lr_frac >= 0 && o.final_lr_frac <= 1, src,
             ": optimizer.final_lr_frac must be in [0, 1], got ", o.final_lr_frac);
  OLMO_CHECK(o.lr > 0, src, ": optimizer.lr must be > 0");
  OLMO_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, src,
             ": optimizer.beta1/beta2 must be in [0, 1)");
  OLMO_CHECK(o.eps > 0, src, ": optimizer.eps must be > 0");
  OLMO_CHECK(o.clip_grad_norm >= 0, src, ": optimizer.clip_grad_norm must be >= 0 (0 = off)");
}

TrainConfig Recipe::config() const {
  TrainConfig c = fields();
  derive_batch(c);
  return c;
}

std::vector<Recipe::Change> Recipe::diff(const Recipe& before, const Recipe& after) {
  std::vector<Change> out;
  auto value = [](const Recipe& r, const std::string& key) {
    auto it = r.values_.find(key);
    if (it != r.values_.end()) return it->second;
    const RecipeKey* k = find_key(key);
    return k ? k->default_value : std::string();
  };
  std::set<std::string> keys;
  for (const auto& k : recipe_keys()) keys.insert(k.name);
  for (const auto& [k, v] : before.values_) keys.insert(k);
  for (const auto& [k, v] : after.values_) keys.insert(k);
  for (const auto& k : keys) {
    std::string a = value(before, k), b = value(after, k);
    if (a != b) out.push_back({k, a, b});
  }
  return out;
}

void require_device_supported(const TrainConfig& c) {
  OLMO_CHECK(
      c.device != "cuda", c.source,
      ": device=cuda: this build has no CUDA training backend yet (issue #15); set device: cpu to train "
      "on the CPUs (docs/cuda.md says what exists for CUDA so far)");
}

void require_run_inputs(const TrainConfig& c, bool model_from_recipe, bool check_device) {
  if (check_device) require_device_supported(c);
  OLMO_CHECK(!c.data.path.empty(), c.source,
             ": data.path is required (a dataset written by `olmosft data build`)");
  if (!model_from_recipe) return;
  OLMO_CHECK(c.model.init.empty() || c.model.config.empty(), c.source,
             ": set only one of model.init and model.config");
  OLMO_CHECK(!c.model.init.empty() || !c.model.config.empty(), c.source,
             ": model.init (HF directory) or model.config (config.json for a random init) is required");
}

bool recipe_key_operational(const std::string& key) {
  static const char* const kPrefixes[] = {"log.", "eval.", "export.", "perf.", "cluster.", "mesh.", "dist."};
  static const std::set<std::string> kKeys = {"devices",
                                              "per_device_batch",
                                              "compute.threads",
                                              "model.remat",
                                              "checkpoint.every",
                                              "checkpoint.keep_last",
                                              "checkpoint.grace_seconds",
                                              "checkpoint.resume",
                                              "checkpoint.allow_recipe_change"};
  for (const char* p : kPrefixes)
    if (key.rfind(p, 0) == 0) return true;
  return kKeys.count(key) > 0;
}

void derive_batch(TrainConfig& c) {
  Derived& d = c.batch;
  const std::string& src = c.source;
  double slots = static_cast<double>(d.devices) * d.per_device_batch;
  double rounded = std::round(slots);
  // (rounded <= 2^62: the cast below is defined; 9e18 devices x 1e300 rows per device made it undefined)
  OLMO_CHECK(rounded >= 1 && rounded <= 0x1p62 && std::fabs(slots - rounded) < 1e-9, src,
             ": devices x per_device_batch = ", d.devices, " x ", d.per_device_batch, " = ", slots,
             " rows per micro-step, which is not a whole number >= 1 (and at most 2^62)");
  d.slots = static_cast<int64_t>(rounded);
  OLMO_CHECK(d.global_batch % d.slots == 0, src, ": global_batch=", d.global_batch,
             " is not divisible by devices x per_device_batch = ", d.slots,
             " (gradient accumulation must be a whole number of micro-steps)");
  d.grad_accum = d.global_batch / d.slots;
  OLMO_CHECK(!__builtin_mul_overflow(d.global_batch, d.seq_len, &d.tokens_per_step), src,
             ": global_batch x seq_len = ", d.global_batch, " x ", d.seq_len,
             " tokens per step does not fit in 64 bits");
  if (d.schedule_steps == 0) d.schedule_steps = d.steps;
  d.warmup_steps =
      static_cast<int64_t>(std::floor(static_cast<double>(d.schedule_steps) * c.optimizer.warmup_frac));
}

void print_derived(std::ostream& os, const Derived& d) {
  os << "PREFLIGHT global_batch=" << d.global_batch << " devices=" << d.devices
     << " per_device_batch=" << d.per_device_batch << " rows_per_microstep=" << d.slots
     << " grad_accum=" << d.grad_accum << " seq_len=" << d.seq_len << " tokens_per_step=" << d.tokens_per_step
     << " steps=" << d.steps << " lr_schedule_steps=" << d.schedule_steps
     << " warmup_steps=" << d.warmup_steps << "\n";
}

}  // namespace olmosft
