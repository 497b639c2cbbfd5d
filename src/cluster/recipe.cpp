#include "cluster/recipe.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "train/recipe.h"

namespace olmosft::cluster {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

bool parse_int(const std::string& s, int64_t& v) {
  if (s.empty()) return false;
  size_t i = 0;
  if (s[0] == '-' || s[0] == '+') i = 1;
  if (i >= s.size()) return false;
  for (size_t j = i; j < s.size(); ++j)
    if (s[j] < '0' || s[j] > '9') return false;
  try {
    v = std::stoll(s);
  } catch (...) {
    return false;
  }
  return true;
}

struct Reader {
  const std::string& origin;
  std::string where(const std::string& key) const { return origin + ": key '" + key + "'"; }

  int64_t integer(const YAML::Node& n, const std::string& key, int64_t lo, int64_t hi) const {
    OLMO_CHECK(n.IsScalar(), where(key), ": expected an integer, got a ", n.IsMap() ? "map" : "list");
    int64_t v = 0;
    OLMO_CHECK(parse_int(n.Scalar(), v), where(key), ": expected an integer, got '", n.Scalar(), "'");
    OLMO_CHECK(v >= lo && v <= hi, where(key), ": ", v, " is out of range [", lo, ", ", hi, "]");
    return v;
  }
  double number(const YAML::Node& n, const std::string& key) const {
    OLMO_CHECK(n.IsScalar(), where(key), ": expected a number");
    const std::string& s = n.Scalar();
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    OLMO_CHECK(!s.empty() && end == s.c_str() + s.size() && std::isfinite(v), where(key),
               ": expected a finite number, got '", s, "'");
    return v;
  }
  std::string string(const YAML::Node& n, const std::string& key) const {
    OLMO_CHECK(n.IsScalar(), where(key), ": expected a string");
    return n.Scalar();
  }
  bool boolean(const YAML::Node& n, const std::string& key) const {
    OLMO_CHECK(n.IsScalar(), where(key), ": expected true or false");
    std::string s = n.Scalar();
    std::transform(s.begin(), s.end(), s.begin(), ::tolower);
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
    fail(where(key), ": expected true or false, got '", n.Scalar(), "'");
  }
  void only_keys(const YAML::Node& map, const std::string& key, const std::set<std::string>& allowed) const {
    OLMO_CHECK(map.IsMap(), where(key), ": expected a map");
    for (const auto& kv : map) {
      const std::string k = kv.first.Scalar();
      if (!allowed.count(k)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(where(key + "." + k), ": unknown key (allowed under '", key, "': ", list, ")");
      }
    }
  }
};

const std::set<std::string> kClusterKeys = {
    "namespace",          "queue",        "image",           "slice",     "host_network", "node_pool",
    "exclusive_topology", "max_restarts", "service_account", "container", "command",      "coordinator_port",
    "stop_rules"};
const std::set<std::string> kStopKeys = {"nan_loss", "max_required_rbf", "stall_minutes"};

// DNS-1123 label check for namespace / queue names (what the API server requires for those objects).
bool dns1123_label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return s.front() != '-' && s.back() != '-';
}

}  // namespace

SliceSpec parse_slice(const std::string& text) {
  SliceSpec s;
  s.text = text;
  const std::string forms =
      "expected 'tpu-<v4|v5p|v5e|v6e>-<AxB[xC]>' (e.g. tpu-v4-4x4x8) or 'gpu-<model>-<nodes>x<gpus>' "
      "(e.g. gpu-h100-2x8)";
  auto dash = text.rfind('-');
  OLMO_CHECK(dash != std::string::npos && text.size() > 4, "slice '", text, "': ", forms);
  const std::string shape = text.substr(dash + 1);
  std::vector<int64_t> dims;
  for (const auto& d : split(shape, 'x')) {
    int64_t v = 0;
    OLMO_CHECK(parse_int(d, v) && v >= 1 && v <= 4096, "slice '", text, "': bad shape '", shape, "'; ",
               forms);
    dims.push_back(v);
  }
  if (text.rfind("tpu-", 0) == 0) {
    s.kind = SliceSpec::Kind::Tpu;
    s.generation = text.substr(4, dash - 4);
    s.topology = shape;
    s.resource_name = "google.com/tpu";
    s.accelerator_key = "cloud.google.com/gke-tpu-accelerator";
    size_t want_dims = 0;
    // GKE accelerator label values; v4/v5p are 3-D tori, v5e/v6e 2-D (GKE TPU docs; check with
    // `kubectl get nodes -L cloud.google.com/gke-tpu-accelerator` on the target cluster).
    if (s.generation == "v4") {
      s.accelerator_value = "tpu-v4-podslice", want_dims = 3;
    } else if (s.generation == "v5p") {
      s.accelerator_value = "tpu-v5p-slice", want_dims = 3;
    } else if (s.generation == "v5e") {
      s.accelerator_value = "tpu-v5-lite-podslice", want_dims = 2;
    } else if (s.generation == "v6e") {
      s.accelerator_value = "tpu-v6e-slice", want_dims = 2;
    } else {
      fail("slice '", text, "': unknown TPU generation '", s.generation, "' (known: v4, v5p, v5e, v6e)");
    }
    OLMO_CHECK(dims.size() == want_dims, "slice '", text, "': TPU ", s.generation, " topology needs ",
               want_dims, " dimensions, got '", shape, "'");
    int64_t chips = 1;
    for (auto d : dims) chips *= d;
    // Multi-host slices have 4 chips per host (v4/v5p: 4 per VM; v5e/v6e multi-host: 4 per VM).
    // Single-host v5e/v6e machines hold up to 8 chips (1x1, 2x2, 2x4).
    if ((want_dims == 2) && chips <= 8) {
      s.hosts = 1, s.devices_per_host = static_cast<int>(chips);
    } else {
      OLMO_CHECK(chips % 4 == 0, "slice '", text, "': ", chips,
                 " chips is not a whole number of 4-chip hosts");
      s.hosts = static_cast<int>(chips / 4), s.devices_per_host = 4;
    }
  } else if (text.rfind("gpu-", 0) == 0) {
    s.kind = SliceSpec::Kind::Gpu;
    s.generation = text.substr(4, dash - 4);
    OLMO_CHECK(dims.size() == 2, "slice '", text, "': GPU shape must be <nodes>x<gpus per node>, got '",
               shape, "'");
    static const std::map<std::string, std::string> gpus = {{"a100", "nvidia-tesla-a100"},
                                                            {"a100-80gb", "nvidia-a100-80gb"},
                                                            {"h100", "nvidia-h100-80gb"},
                                                            {"h100-mega", "nvidia-h100-mega-80gb"},
                                                            {"h200", "nvidia-h200-141gb"},
                                                            {"b200", "nvidia-b200"},
                                                            {"l4", "nvidia-l4"}};
    auto it = gpus.find(s.generation);
    if (it == gpus.end()) {
      std::string known;
      for (const auto& [k, v] : gpus) known += (known.empty() ? "" : ", ") + k;
      fail("slice '", text, "': unknown GPU model '", s.generation, "' (known: ", known, ")");
    }
    s.accelerator_key = "cloud.google.com/gke-accelerator";
    s.accelerator_value = it->second;
    s.resource_name = "nvidia.com/gpu";
    s.hosts = static_cast<int>(dims[0]);
    s.devices_per_host = static_cast<int>(dims[1]);
    OLMO_CHECK(s.devices_per_host <= 16, "slice '", text, "': ", s.devices_per_host,
               " GPUs per node is more than 16");
  } else {
    fail("slice '", text, "': ", forms);
  }
  return s;
}

void apply_override(YAML::Node& root, const std::string& kv) {
  auto eq = kv.find('=');
  OLMO_CHECK(eq != std::string::npos && eq > 0, "override '", kv, "': expected key=value (e.g. steps=100)");
  const std::string key = kv.substr(0, eq);
  const std::string value = kv.substr(eq + 1);
  auto parts = split(key, '.');
  for (const auto& p : parts)
    OLMO_CHECK(!p.empty(), "override '", kv, "': empty path component in '", key, "'");
  YAML::Node v;
  try {
    v = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    fail("override '", kv, "': value is not valid YAML: ", e.what());
  }
  if (!root || !root.IsMap()) root = YAML::Node(YAML::NodeType::Map);
  YAML::Node cur = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!cur[parts[i]] || !cur[parts[i]].IsMap()) {
      OLMO_CHECK(!cur[parts[i]] || cur[parts[i]].IsNull(), "override '", kv, "': '", parts[i],
                 "' is not a map in the recipe");
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
    }
    YAML::Node next = cur[parts[i]];
    cur.reset(next);
  }
  cur[parts.back()] = v;
}

std::string Recipe::effective_yaml() const {
  YAML::Emitter e;
  e << root;
  return std::string(e.c_str()) + "\n";
}

void check_fits(Recipe& r) {
  const SliceSpec& s = r.cluster.slice;
  const int64_t devices = s.devices();
  const double p = r.per_device_batch;
  const std::string what = r.origin + ": batch does not fit slice " + s.text + " (" +
                           std::to_string(s.hosts) + " hosts x " + std::to_string(s.devices_per_host) +
                           " devices = " + std::to_string(devices) + " devices)";
  OLMO_CHECK(p > 0, what, ": per_device_batch must be > 0");
  // A fractional per-device batch means 1/p devices share one row (the runbook: 0.125 = one row on 8 chips);
  // it must be 1/k for an integer k that divides the device count. Above 1 it must be an integer.
  if (p < 1) {
    const double k = 1.0 / p;
    const int64_t ki = std::llround(k);
    OLMO_CHECK(std::fabs(k - static_cast<double>(ki)) < 1e-9 * k, what, ": per_device_batch ", p,
               " is fractional but not 1/k for an integer k");
    OLMO_CHECK(devices % ki == 0, what, ": per_device_batch ", p, " puts one row on ", ki,
               " devices, which does not divide ", devices);
    r.rows_per_step = devices / ki;
  } else {
    const int64_t pi = std::llround(p);
    OLMO_CHECK(std::fabs(p - static_cast<double>(pi)) < 1e-9 * p, what, ": per_device_batch ", p,
               " above 1 must be an integer");
    r.rows_per_step = devices * pi;
  }
  OLMO_CHECK(r.global_batch % r.rows_per_step == 0, what, ": global_batch ", r.global_batch,
             " is not a multiple of devices x per_device_batch = ", devices, " x ", p, " = ",
             r.rows_per_step);
  r.grad_accum = r.global_batch / r.rows_per_step;
  if (!r.mesh.empty()) {
    int64_t prod = 1;
    std::string axes;
    for (const auto& [k, v] : r.mesh) {
      prod *= v;
      axes += (axes.empty() ? "" : " x ") + k + "=" + std::to_string(v);
    }
    OLMO_CHECK(prod == devices, r.origin, ": mesh ", axes, " covers ", prod, " devices, but slice ", s.text,
               " has ", devices);
  }
}

Recipe parse_recipe(const std::string& text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  Recipe r;
  r.origin = origin;
  r.source_text = text;
  r.overrides = overrides;
  try {
    r.root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(origin, ": not valid YAML: ", e.what());
  }
  if (!r.root || r.root.IsNull()) r.root = YAML::Node(YAML::NodeType::Map);
  OLMO_CHECK(r.root.IsMap(), origin, ": the recipe must be a YAML map of keys");
  for (const auto& o : overrides) apply_override(r.root, o);

  Reader rd{origin};
  const YAML::Node& R = r.root;
  auto need = [&](const YAML::Node& parent, const std::string& key, const std::string& full) {
    YAML::Node n = parent[key];
    OLMO_CHECK(n && !n.IsNull(), rd.where(full), ": missing (required)");
    return n;
  };
  r.run_name = rd.string(need(R, "run_name", "run_name"), "run_name");
  OLMO_CHECK(!r.run_name.empty(), rd.where("run_name"), ": must not be empty");
  r.seq_len = rd.integer(need(R, "seq_len", "seq_len"), "seq_len", 1, int64_t{1} << 24);
  r.global_batch = rd.integer(need(R, "global_batch", "global_batch"), "global_batch", 1, int64_t{1} << 24);
  r.per_device_batch = rd.number(need(R, "per_device_batch", "per_device_batch"), "per_device_batch");
  r.steps = rd.integer(need(R, "steps", "steps"), "steps", 1, int64_t{1} << 40);
  r.output_dir = rd.string(need(R, "output_dir", "output_dir"), "output_dir");
  if (R["checkpoint"]) {
    OLMO_CHECK(R["checkpoint"].IsMap(), rd.where("checkpoint"), ": expected a map");
    if (R["checkpoint"]["grace_seconds"])
      r.grace_seconds = static_cast<int>(
          rd.integer(R["checkpoint"]["grace_seconds"], "checkpoint.grace_seconds", 1, 24 * 3600));
  }
  if (R["mesh"] && !R["mesh"].IsNull()) {
    OLMO_CHECK(R["mesh"].IsMap(), rd.where("mesh"),
               ": expected a map of axis: size (e.g. {fsdp: 16, expert: 8})");
    for (const auto& kv : R["mesh"])
      r.mesh[kv.first.Scalar()] = rd.integer(kv.second, "mesh." + kv.first.Scalar(), 1, 1 << 20);
  }

  const YAML::Node C = need(R, "cluster", "cluster");
  rd.only_keys(C, "cluster", kClusterKeys);
  ClusterSpec& c = r.cluster;
  if (C["namespace"]) c.namespace_ = rd.string(C["namespace"], "cluster.namespace");
  OLMO_CHECK(dns1123_label(c.namespace_), rd.where("cluster.namespace"), ": '", c.namespace_,
             "' is not a valid namespace name (lowercase letters, digits, '-', at most 63)");
  c.queue = rd.string(need(C, "queue", "cluster.queue"), "cluster.queue");
  OLMO_CHECK(dns1123_label(c.queue), rd.where("cluster.queue"), ": '", c.queue,
             "' is not a valid LocalQueue name");
  c.image = rd.string(need(C, "image", "cluster.image"), "cluster.image");
  OLMO_CHECK(!c.image.empty() && c.image.find(' ') == std::string::npos, rd.where("cluster.image"),
             ": expected an image reference");
  try {
    c.slice = parse_slice(rd.string(need(C, "slice", "cluster.slice"), "cluster.slice"));
  } catch (const Error& e) {
    fail(rd.where("cluster.slice"), ": ", e.what());
  }
  c.host_network = c.slice.multi_host_tpu();
  if (C["host_network"]) c.host_network = rd.boolean(C["host_network"], "cluster.host_network");
  if (C["node_pool"] && !C["node_pool"].IsNull())
    c.node_pool = rd.string(C["node_pool"], "cluster.node_pool");
  if (c.slice.kind == SliceSpec::Kind::Tpu) c.exclusive_topology = "cloud.google.com/gke-nodepool";
  if (C["exclusive_topology"])
    c.exclusive_topology = C["exclusive_topology"].IsNull()
                               ? ""
                               : rd.string(C["exclusive_topology"], "cluster.exclusive_topology");
  if (C["max_restarts"])
    c.max_restarts = static_cast<int>(rd.integer(C["max_restarts"], "cluster.max_restarts", 0, 1000));
  if (C["service_account"]) c.service_account = rd.string(C["service_account"], "cluster.service_account");
  if (C["container"]) c.container = rd.string(C["container"], "cluster.container");
  OLMO_CHECK(dns1123_label(c.container), rd.where("cluster.container"), ": not a valid container name");
  if (C["command"]) {
    OLMO_CHECK(C["command"].IsSequence() && C["command"].size() > 0, rd.where("cluster.command"),
               ": expected a non-empty list of strings");
    for (const auto& a : C["command"]) c.command.push_back(rd.string(a, "cluster.command[]"));
  } else {
    c.command = {"olmosft", "train", "/etc/olmosft/recipe.yaml"};
  }
  if (C["coordinator_port"])
    c.coordinator_port =
        static_cast<int>(rd.integer(C["coordinator_port"], "cluster.coordinator_port", 1, 65535));
  if (C["stop_rules"] && !C["stop_rules"].IsNull()) {
    const YAML::Node S = C["stop_rules"];
    rd.only_keys(S, "cluster.stop_rules", kStopKeys);
    if (S["nan_loss"]) c.stop_rules.nan_loss = rd.boolean(S["nan_loss"], "cluster.stop_rules.nan_loss");
    if (S["max_required_rbf"] && !S["max_required_rbf"].IsNull()) {
      double v = rd.number(S["max_required_rbf"], "cluster.stop_rules.max_required_rbf");
      OLMO_CHECK(v > 0, rd.where("cluster.stop_rules.max_required_rbf"), ": must be > 0");
      c.stop_rules.max_required_rbf = v;
    }
    if (S["stall_minutes"] && !S["stall_minutes"].IsNull()) {
      double v = rd.number(S["stall_minutes"], "cluster.stop_rules.stall_minutes");
      OLMO_CHECK(v > 0, rd.where("cluster.stop_rules.stall_minutes"), ": must be > 0");
      c.stop_rules.stall_minutes = v;
    }
  }
  check_fits(r);
  // The pod runs `olmosft train` on this same file: the devices the trainer divides the batch by are the
  // slice's, and every trainer key is validated now with the trainer's own reader (unknown keys, types,
  // batch arithmetic), so a typo fails the launch instead of a pod after scheduling.
  const int64_t devices = c.slice.devices();
  if (R["devices"] && !R["devices"].IsNull()) {
    const int64_t d = rd.integer(R["devices"], "devices", 1, int64_t{1} << 24);
    OLMO_CHECK(d == devices, rd.where("devices"), ": ", d, " but slice ", c.slice.text, " has ", devices,
               " devices (drop the key: the launcher sets it from the slice)");
  } else {
    r.root["devices"] = devices;
  }
  const olmosft::Recipe trainer_view =
      olmosft::Recipe::parse(r.effective_yaml(), origin + " (as `olmosft train` reads it)");
  (void)olmosft::derive(trainer_view);
  return r;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path, std::ios::binary);
  OLMO_CHECK(f, "recipe ", path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_recipe(ss.str(), path, overrides);
}

}  // namespace olmosft::cluster
