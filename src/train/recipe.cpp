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

namespace {

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
    case KeyType::List:  // no trainer key is a list (flatten refuses one outside the passthrough sections)
      bad("a list");
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
  const RecipeKey* k = find_recipe_key(key);
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
  const RecipeKey* k = find_recipe_key(key);
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
  for (const RecipeKey& k : recipe_keys()) k.read(c, str(k.name), src);
  // Across keys.
  OLMO_CHECK(
      !(c.model.memory.saved == model::SavedDtype::BF16 && c.model.memory.remat == model::Remat::Full), src,
      ": model.saved_dtype=bf16 does nothing under model.remat=full (full keeps only the block inputs, "
      "in fp32, so that the backward's re-run reproduces the forward); use model.remat=attn or none with "
      "bf16, or saved_dtype fp32 with full");

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
    const RecipeKey* k = find_recipe_key(key);
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
      ": device=cuda: olmosft has no hand-written CUDA backend; train on NVIDIA GPUs with device: xla and "
      "xla.plugin: cuda (XLA's CUDA plugin, docs/xla.md), or on the CPUs with device: cpu");
  OLMO_CHECK(
      c.device != "xla" || c.dist.mode == "dp", c.source, ": device=xla needs dist.mode dp (the XLA ",
      "backend holds every parameter in each process; the mesh (mesh.fsdp) splits them over a process's ",
      "devices; got dist.mode ", c.dist.mode, ")");
}

xla::Mesh xla_mesh(const TrainConfig& c) {
  xla::Mesh m;
  if (c.mesh.empty()) {  // the older spelling: xla.devices N, replicated ({data: N}) or split ({fsdp: N})
    (c.xla.shard_params ? m.fsdp : m.data) = c.xla.devices;
    return m;
  }
  for (const auto& [k, v] : c.mesh) {
    const std::optional<xla::MeshAxis> a = xla::mesh_axis_named(k);
    OLMO_CHECK(a.has_value(), c.source, ": key 'mesh.", k, "': device: xla knows the mesh axes ",
               xla::mesh_axis_names(), " (docs/xla.md \"The device mesh\")");
    m.at(*a) = v;
  }
  OLMO_CHECK(!c.xla.shard_params, c.source,
             ": xla.shard_params is the older spelling of a mesh; with mesh.* given, parameters split over "
             "mesh.fsdp x mesh.expert x mesh.context (drop xla.shard_params)");
  OLMO_CHECK(c.xla.devices == 1 || c.xla.devices == m.devices(), c.source, ": xla.devices ", c.xla.devices,
             " but the mesh (", m.text(), ") has ", m.devices(), " devices (drop xla.devices)");
  return m;
}

int64_t devices_per_process(const TrainConfig& c) { return c.device == "xla" ? xla_mesh(c).devices() : 1; }

void require_xla_layout(const TrainConfig& c, int64_t world, int64_t local_processes) {
  if (c.device != "xla") return;
  const xla::Mesh m = xla_mesh(c);
  const int64_t procs = std::max<int64_t>(world, 1);
  // per_device_batch counts rows per XLA device, so the micro-step's rows are devices x per_device_batch
  // only when devices is the job's XLA devices: an explicit other count (the demo's `devices: 1` under a
  // 4-device mesh) would silently change the accumulation.
  OLMO_CHECK(c.batch.devices == procs * m.devices(), c.source, ": devices=", c.batch.devices,
             " but the mesh (", m.text(), ") has ", m.devices(), " XLA devices per process x ", procs,
             " process(es) = ", procs * m.devices(),
             ": set devices to that (or leave it out: it defaults to it)");
  const int64_t rows = c.batch.slots / procs;
  OLMO_CHECK(rows % m.batch_shards() == 0, c.source, ": the mesh (", m.text(),
             ") splits each process's rows per micro-step evenly over data x fsdp = ", m.batch_shards(),
             " devices; devices x per_device_batch / processes = ", rows,
             " is not a multiple (per_device_batch counts rows per XLA device)");
  OLMO_CHECK(c.batch.seq_len % m.seq_shards() == 0, c.source, ": the mesh (", m.text(),
             ") splits each row's tokens over expert x context = ", m.seq_shards(), " devices; seq_len ",
             c.batch.seq_len, " is not a multiple");
  OLMO_CHECK(c.xla.plugin == "cpu" || local_processes <= 1, c.source, ": device=xla with xla.plugin ",
             c.xla.plugin, ": ", local_processes,
             " processes on this host would share its accelerators (each PJRT client opens all of them); "
             "start one process per host, with xla.devices for how many of them it trains on (docs/xla.md)");
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
