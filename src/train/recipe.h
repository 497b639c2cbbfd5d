// Training recipes: a YAML file plus key=value overrides (command line wins). Every key has a type, a
// documented default and a description (recipe_keys()); an unknown key is an error that names it and the
// closest known key. Derived values (gradient accumulation, warmup steps, tokens per step) are computed
// once by derive() and checked before any compute.
#pragma once
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace olmosft {

enum class KeyType { String, Int, Float, Bool };

struct RecipeKey {
  std::string name;  // dotted, e.g. "optimizer.lr"
  KeyType type;
  std::string default_value;  // as written in YAML
  std::string doc;
};

// All known keys (the `cluster.*` section is passed through for the k8s tooling, validated there).
const std::vector<RecipeKey>& recipe_keys();

class Recipe {
 public:
  // Reads a YAML recipe (nested maps flatten to dotted keys) and applies key=value overrides in order.
  static Recipe load(const std::string& yaml_path, const std::vector<std::string>& overrides = {});
  // Parses YAML text; `source` names it in errors.
  static Recipe parse(const std::string& yaml_text, const std::string& source,
                      const std::vector<std::string>& overrides = {});

  std::string str(const std::string& key) const;
  int64_t i64(const std::string& key) const;
  double f64(const std::string& key) const;
  bool flag(const std::string& key) const;
  bool is_set(const std::string& key) const;  // given in the file or an override (not a default)
  // Pass-through keys under a prefix (e.g. "cluster."), as raw strings.
  std::map<std::string, std::string> section(const std::string& prefix) const;
  const std::string& source() const { return source_; }

  // Sets one key from "key=value" text (validated); `origin` names where it came from in errors.
  void set(const std::string& key, const std::string& value, const std::string& origin);
  // Writes the fully resolved recipe (every key, defaults included) as YAML.
  void write_yaml(std::ostream& os) const;

 private:
  std::string source_;
  std::map<std::string, std::string> values_;  // only keys that were set
};

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

// Throws olmosft::Error naming the keys when the numbers do not divide or are out of range.
Derived derive(const Recipe& r);
void print_derived(std::ostream& os, const Derived& d);

}  // namespace olmosft
