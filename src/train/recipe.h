// Training recipes: a YAML file plus key=value overrides (command line wins). Every key has a type, a
// documented default and a description (recipe_keys()); an unknown key is an error that names it and the
// closest known key. Recipe::config() reads it once into a typed, validated TrainConfig (derived values:
// gradient accumulation, warmup steps, tokens per step), checked before any compute.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "model/loss_terms.h"
#include "model/memory_policy.h"
#include "xla/mesh.h"

namespace olmosft {

// A key's value type. List: a YAML list (`cluster.command`; the trainer's own keys are single values).
enum class KeyType { String, Int, Float, Bool, List };
const char* key_type_name(KeyType t);  // "string", "int", "float", "bool", "list"
// Whether a resumed run may change a key: Operational keys change how a run is executed (process layout,
// threads, logging, checkpoint cadence, ...) but not what it computes beyond summation order; Math keys
// change the run's numbers (data, model, optimizer, losses, batch, steps, ...): a different run.
enum class OnResume { Math, Operational };
struct TrainConfig;

// What every row of a recipe key table says about its key, whichever layer reads it: the trainer's table
// (RecipeKey, train/recipe_schema.cpp) or the k8s launcher's `cluster.*` table (cluster/recipe_keys.h, which
// the trainer passes through as text). `olmosft recipe keys` prints these rows (print_recipe_key).
struct RecipeKeyDoc {
  std::string name;  // dotted, e.g. "optimizer.lr"
  KeyType type;
  // As written in YAML; for a key without one default value (required, or derived from other keys) a
  // description in parentheses, e.g. "(required)".
  std::string default_value;
  std::string doc;
  OnResume on_resume = OnResume::Math;
};
// One `olmosft recipe keys` line: "NAME = DEFAULT  # TYPE: DOC" (an empty default shown as "").
void print_recipe_key(std::ostream& os, const RecipeKeyDoc& k);

// One trainer recipe key (train/recipe_schema.cpp holds the table): its RecipeKeyDoc, and how it is read
// into its TrainConfig field with its validation (throws olmosft::Error naming `source` and the key). `read`
// gets a value already checked against `type`.
struct RecipeKey : RecipeKeyDoc {
  std::function<void(TrainConfig&, const std::string& value, const std::string& source)> read;
};

// The trainer's keys: the only list of them. The `cluster.*` section is the k8s launcher's table
// (cluster/recipe_keys.h cluster_keys(): the trainer passes it through as text, the launcher reads and
// validates it); `mesh.*` holds mesh axis sizes.
const std::vector<RecipeKey>& recipe_keys();
const RecipeKey* find_recipe_key(const std::string& name);  // nullptr for an unknown key

// Values derived from a recipe, computed once and checked (batch arithmetic, schedule horizon).
struct Derived {
  int64_t global_batch = 0;     // rows per optimizer step
  int64_t devices = 0;          // processes x accelerators (CPU: processes)
  double per_device_batch = 0;  // rows per device per micro-step (may be < 1 when a row spans devices)
  int64_t slots = 0;       // rows processed per micro-step across all devices = devices x per_device_batch
  int64_t grad_accum = 0;  // micro-steps per optimizer step = global_batch / slots
  int64_t seq_len = 0;
  int64_t tokens_per_step = 0;  // global_batch x seq_len (padding included)
  int64_t steps = 0;            // optimizer steps to train
  int64_t schedule_steps = 0;   // LR schedule horizon (>= steps is typical)
  int64_t warmup_steps = 0;     // floor(schedule_steps x warmup_frac)
};

// The recipe, typed and validated: every key of recipe_keys() as a field (named after the key and its
// section), the batch arithmetic derived, the pass-through sections kept. Made once by Recipe::config();
// the trainer, the CLI and the k8s launcher read these fields, never keys.
struct TrainConfig {
  std::string source;           // the recipe file (names it in errors)
  std::string resolved_yaml;    // Recipe::write_yaml: printed at start, hashed into checkpoints
  std::set<std::string> given;  // keys set in the file or an override (not defaults)
  std::string run_name, output_dir;
  int64_t seed = 0;
  std::string device = "cpu";  // cpu | xla | cuda (cuda is refused by require_device_supported)
  struct Xla {
    std::string plugin = "cpu";           // xla.plugin: cpu | cuda | tpu | a PJRT plugin path (device: xla)
    int64_t cpu_devices = 1;              // xla.cpu_devices: devices XLA's CPU plugin creates
    int64_t devices = 1;                  // xla.devices: devices of the SPMD step (data parallel)
    bool shard_params = false;            // xla.shard_params: parameters and optimizer state split over them
    bool scan_layers = false;             // xla.scan_layers: the layers as a loop (model/layer_pass.h)
    double memory_limit_gib = 0;          // xla.memory_limit_gib: bytes a program may need (0: the device's)
    std::string attention = "blockwise";  // xla.attention: blockwise | cudnn (CUDA plugin)
    int64_t delta_chunk = 64;             // xla.delta_chunk: the delta rule's chunk (0: the recurrence)
  } xla;
  std::string tokenizer;
  struct Model {
    std::string init, config;    // model.init (HF directory) / model.config (config.json, random init)
    model::MemoryPolicy memory;  // model.remat / model.saved_dtype
  } model;
  struct Data {
    std::string path;
    int64_t epochs = 1;
  } data;
  // global_batch, devices, per_device_batch, seq_len, steps, lr_schedule_steps and what derive_batch makes
  Derived batch;
  struct Dist {
    std::string mode = "dp";       // dp | zero3
    std::string gather = "layer";  // layer | step
  } dist;
  struct Optimizer {
    std::string schedule = "linear";  // linear | constant
    double lr = 0, warmup_frac = 0, final_lr_frac = 0;
    double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, clip_grad_norm = 0;
  } optimizer;
  struct Loss {
    model::LossValues weight{1.0, 0.0, 0.0, 0.0};  // per loss term (model/loss_terms.h): its weight key
  } loss;
  struct Moe {
    double buffer_factor = -1;  // -1 = dropless
  } moe;
  struct Compute {
    int64_t vocab_tile = 0, threads = 0;
    CpuGemm gemm;  // compute.gemm ("auto" resolved here) / compute.dtype
  } compute;
  struct Checkpoint {
    int64_t every = 0, keep_last = 1, grace_seconds = 1;
    bool resume = true;
    bool allow_recipe_change = false;  // resume although keys that change the run's numbers differ
  } checkpoint;
  struct Guard {
    double grad_norm_spike = 0;  // stop when grad norm > this x the recent median (0 = off)
  } guard;
  struct Log {
    int64_t every = 1;
    bool tensorboard = true;
  } log;
  struct Eval {
    int64_t heldout = 0;
  } eval;
  struct Export {
    bool hf = true;
  } export_;
  struct Perf {
    double peak_tflops = 0;  // 0 = measure
  } perf;
  std::map<std::string, int64_t> mesh;         // mesh.<axis>: size (each >= 1)
  std::map<std::string, std::string> cluster;  // cluster.<key> (dotted below it) as raw text, for src/cluster

  std::string run_dir() const { return output_dir + "/" + run_name; }
};

class Recipe {
 public:
  // Reads a YAML recipe (nested maps flatten to dotted keys) and applies key=value overrides in order.
  static Recipe load(const std::string& yaml_path, const std::vector<std::string>& overrides = {});
  // Parses YAML text; `source` names it in errors.
  static Recipe parse(const std::string& yaml_text, const std::string& source,
                      const std::vector<std::string>& overrides = {});

  const std::string& source() const { return source_; }

  // Sets one key from "key=value" text (validated); `origin` names where it came from in errors.
  void set(const std::string& key, const std::string& value, const std::string& origin);
  // set() unless the file or an override gave the key (e.g. devices from the process count).
  void set_default(const std::string& key, const std::string& value, const std::string& origin);
  // Writes the fully resolved recipe (every key, defaults included) as YAML.
  void write_yaml(std::ostream& os) const;

  // Keys whose values differ between two recipes (defaults included), in key order.
  struct Change {
    std::string key, before, after;
  };
  static std::vector<Change> diff(const Recipe& before, const Recipe& after);

  // The typed config: fields() and then derive_batch(). Throws olmosft::Error naming the file and the key.
  TrainConfig config() const;
  // Every key read, typed and range-checked, without the batch arithmetic (batch holds the given numbers
  // only): for a reader that checks the batch against something first (the k8s launcher, its slice).
  TrainConfig fields() const;

 private:
  std::string str(const std::string& key) const;
  int64_t i64(const std::string& key) const;
  double f64(const std::string& key) const;
  bool flag(const std::string& key) const;

  std::string source_;
  std::map<std::string, std::string> values_;  // only keys that were set
};

// What `olmosft train` requires beyond types and ranges, checked without touching any file: data.path, and
// (with model_from_recipe) exactly one of model.init / model.config. `olmosft train`, the trainer (whose
// caller may pass the model in: model_from_recipe=false) and `k8s render` (a pod would fail after scheduling)
// call it. Throws olmosft::Error naming the recipe and the key. With check_device it first calls
// require_device_supported; `k8s render` passes false and reports the device itself (it renders GPU JobSets
// for a device=cuda recipe, saying plainly that this build's pods would refuse it).
void require_run_inputs(const TrainConfig& c, bool model_from_recipe = true, bool check_device = true);
// Refuses a device this build cannot train on (device=cuda: no hand-written CUDA backend; GPUs train through
// device=xla with xla.plugin=cuda), before any compute. Throws olmosft::Error naming the recipe and the key.
void require_device_supported(const TrainConfig& c);
// device: xla's device mesh (xla/mesh.h): mesh.{data,fsdp,expert,context} when any is given (other axis
// names refused; xla.devices must then be 1 or their product, xla.shard_params false), else the older
// spelling xla.devices N as {data: N}, or {fsdp: N} with xla.shard_params. Throws naming the recipe and key.
xla::Mesh xla_mesh(const TrainConfig& c);
// The devices one process trains on: the mesh's with device xla, else 1 (`devices` = processes x this).
int64_t devices_per_process(const TrainConfig& c);
// device=xla's layout over WORLD processes, LOCAL_PROCESSES of them on this host (docs/xla.md): on an
// accelerator (xla.plugin not cpu) one process per host (each process's PJRT client would open all of the
// host's accelerators, XLA's CUDA plugin preallocating on each); each process's rows per micro-step
// (devices x per_device_batch / WORLD) a multiple of the mesh's data x fsdp, which split them, and seq_len
// of its expert x context. Throws naming the recipe.
void require_xla_layout(const TrainConfig& c, int64_t world, int64_t local_processes);

// True for keys a resumed run may change (OnResume::Operational in the schema, and the cluster and mesh
// sections).
bool recipe_key_operational(const std::string& key);

// The batch arithmetic and the schedule horizon of c.batch (slots, grad_accum, tokens_per_step,
// schedule_steps, warmup_steps). Throws olmosft::Error naming the keys when the numbers do not divide.
void derive_batch(TrainConfig& c);
void print_derived(std::ostream& os, const Derived& d);

}  // namespace olmosft
