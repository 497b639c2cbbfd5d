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

// Reads the raw `cluster.*` values the trainer's reader passed through (TrainConfig::cluster).
struct Reader {
  const std::string& origin;
  const std::map<std::string, std::string>& raw;  // key below `cluster.` -> text
  std::string where(const std::string& key) const { return origin + ": key '" + key + "'"; }

  // The value of cluster.<key>; nullopt when absent or null.
  std::optional<std::string> get(const std::string& key) const {
    auto it = raw.find(key);
    if (it == raw.end() || it->second.empty()) return std::nullopt;
    return it->second;
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const {
    const std::string s = *get(key);
    int64_t v = 0;
    OLMO_CHECK(parse_int(s, v), where("cluster." + key), ": expected an integer, got '", s, "'");
    OLMO_CHECK(v >= lo && v <= hi, where("cluster." + key), ": ", v, " is out of range [", lo, ", ", hi, "]");
    return v;
  }
  double number(const std::string& key) const {
    const std::string s = *get(key);
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    OLMO_CHECK(!s.empty() && end == s.c_str() + s.size() && std::isfinite(v), where("cluster." + key),
               ": expected a finite number, got '", s, "'");
    return v;
  }
  bool boolean(const std::string& key) const {
    std::string s = *get(key);
    std::transform(s.begin(), s.end(), s.begin(), ::tolower);
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
    fail(where("cluster." + key), ": expected true or false, got '", *get(key), "'");
  }
  // Every key is a known one; a value under a key that expects a single value is refused.
  void only_known(const std::set<std::string>& top, const std::set<std::string>& stop) const {
    auto list = [](const std::set<std::string>& allowed) {
      std::string l;
      for (const auto& a : allowed) l += (l.empty() ? "" : ", ") + a;
      return l;
    };
    for (const auto& [k, v] : raw) {
      const std::string head = k.substr(0, k.find('.'));
      if (!top.count(head))
        fail(where("cluster." + head), ": unknown key (allowed under 'cluster': ", list(top), ")");
      if (head != "stop_rules" && head != k)
        fail(where("cluster." + head), ": expected a single value, not a map");
      if (head == "stop_rules" && head == k && !v.empty())
        fail(where("cluster.stop_rules"), ": expected a map (", list(stop), ")");
      if (head == "stop_rules" && head != k && !stop.count(k.substr(11)))
        fail(where("cluster." + k), ": unknown key (allowed under 'cluster.stop_rules': ", list(stop), ")");
    }
  }
};

const std::set<std::string> kClusterKeys = {"namespace",
                                            "queue",
                                            "image",
                                            "slice",
                                            "accelerator",
                                            "nodes",
                                            "gpu_label",
                                            "nccl_socket_ifname",
                                            "allow_cpu_on_accelerator_hosts",
                                            "host_network",
                                            "node_pool",
                                            "exclusive_topology",
                                            "max_restarts",
                                            "service_account",
                                            "container",
                                            "command",
                                            "coordinator_port",
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

const std::vector<GpuType>& gpu_types() {
  // GKE's cloud.google.com/gke-accelerator values and machine types (docs/reference/cluster_ops.md: values
  // seen in public manifests), GPU Feature Discovery's nvidia.com/gpu.product (nvidia-smi's name, spaces as
  // '-'; check both with `kubectl get nodes -L cloud.google.com/gke-accelerator,nvidia.com/gpu.product`).
  static const std::vector<GpuType> types = {
      {"nvidia-tesla-a100", "a100", "NVIDIA-A100-SXM4-40GB", 8, 40, "a2-highgpu-8g"},
      {"nvidia-a100-80gb", "a100-80gb", "NVIDIA-A100-SXM4-80GB", 8, 80, "a2-ultragpu-8g"},
      {"nvidia-h100-80gb", "h100", "NVIDIA-H100-80GB-HBM3", 8, 80, "a3-highgpu-8g"},
      {"nvidia-h100-mega-80gb", "h100-mega", "NVIDIA-H100-80GB-HBM3", 8, 80, "a3-megagpu-8g"},
      {"nvidia-h200-141gb", "h200", "NVIDIA-H200", 8, 141, "a3-ultragpu-8g"},
      {"nvidia-b200", "b200", "NVIDIA-B200", 8, 180, "a4-highgpu-8g"},
      {"nvidia-l4", "l4", "NVIDIA-L4", 8, 24, "g2-standard-96"},
  };
  return types;
}

const GpuType& find_gpu_type(const std::string& name, bool by_model) {
  std::string known;
  for (const auto& t : gpu_types()) {
    if ((by_model ? t.model : t.accelerator) == name) return t;
    known += (known.empty() ? "" : ", ") + (by_model ? t.model : t.accelerator);
  }
  fail("unknown GPU ", by_model ? "model '" : "accelerator '", name, "' (known: ", known, ")");
}

SliceSpec gpu_slice(const GpuType& type, int nodes) {
  OLMO_CHECK(nodes >= 1 && nodes <= 4096, "GPU nodes: ", nodes, " is out of range [1, 4096]");
  SliceSpec s;
  s.kind = SliceSpec::Kind::Gpu;
  s.gpu = &type;
  s.generation = type.model;
  s.hosts = nodes;
  s.devices_per_host = type.gpus_per_node;
  s.text = "gpu-" + type.model + "-" + std::to_string(nodes) + "x" + std::to_string(type.gpus_per_node);
  s.accelerator_key = "cloud.google.com/gke-accelerator";
  s.accelerator_value = type.accelerator;
  s.resource_name = "nvidia.com/gpu";
  return s;
}

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
    OLMO_CHECK(dims.size() == 2, "slice '", text, "': GPU shape must be <nodes>x<gpus per node>, got '",
               shape, "'");
    const GpuType* found = nullptr;
    try {
      found = &find_gpu_type(text.substr(4, dash - 4), /*by_model=*/true);
    } catch (const Error& e) {
      fail("slice '", text, "': ", e.what());
    }
    const GpuType& type = *found;
    OLMO_CHECK(dims[1] <= type.gpus_per_node, "slice '", text, "': ", dims[1], " GPUs per node, but a ",
               type.accelerator, " node has ", type.gpus_per_node, " (", type.machine, ")");
    s = gpu_slice(type, static_cast<int>(dims[0]));
    s.devices_per_host = static_cast<int>(dims[1]);
    s.text = text;
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
  const double p = r.train.batch.per_device_batch;
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
  } else {
    const int64_t pi = std::llround(p);
    OLMO_CHECK(std::fabs(p - static_cast<double>(pi)) < 1e-9 * p, what, ": per_device_batch ", p,
               " above 1 must be an integer");
  }
  // The batch arithmetic is the trainer's (train/recipe.cpp derive_batch) over the slice's devices.
  r.train.batch.devices = devices;
  try {
    derive_batch(r.train);
  } catch (const Error& e) {
    fail(what, ": ", e.what());
  }
  if (!r.train.mesh.empty()) {
    int64_t prod = 1;
    std::string axes;
    for (const auto& [k, v] : r.train.mesh) {
      prod *= v;
      axes += (axes.empty() ? "" : " x ") + k + "=" + std::to_string(v);
    }
    OLMO_CHECK(prod == devices, r.origin, ": mesh ", axes, " covers ", prod, " devices, but slice ", s.text,
               " has ", devices);
  }
}

namespace {

// The slice: cluster.slice (TPU, or the gpu-<model>-NxG form), or cluster.accelerator + cluster.nodes (GPU).
void read_slice(const Reader& rd, ClusterSpec& c) {
  const auto slice = rd.get("slice"), acc = rd.get("accelerator");
  OLMO_CHECK(!(slice && acc), rd.where("cluster.accelerator"),
             ": give cluster.slice (a TPU slice) or cluster.accelerator (GPU nodes), not both");
  OLMO_CHECK(slice || acc, rd.where("cluster.slice"),
             ": missing (required: cluster.slice for a TPU slice, or cluster.accelerator for GPU nodes)");
  if (slice) {
    OLMO_CHECK(!rd.get("nodes"), rd.where("cluster.nodes"),
               ": only with cluster.accelerator (a slice string carries its own shape)");
    try {
      c.slice = parse_slice(*slice);
    } catch (const Error& e) {
      fail(rd.where("cluster.slice"), ": ", e.what());
    }
  } else {
    const GpuType* type = nullptr;
    try {
      type = &find_gpu_type(*acc);
    } catch (const Error& e) {
      fail(rd.where("cluster.accelerator"), ": ", e.what());
    }
    const int nodes = rd.get("nodes") ? static_cast<int>(rd.integer("nodes", 1, 4096)) : 1;
    c.slice = gpu_slice(*type, nodes);
  }
  if (auto v = rd.get("gpu_label")) c.gpu_label = *v;
  OLMO_CHECK(c.gpu_label == "gke" || c.gpu_label == "nvidia", rd.where("cluster.gpu_label"),
             ": expected gke (cloud.google.com/gke-accelerator) or nvidia (nvidia.com/gpu.product), got '",
             c.gpu_label, "'");
  if (c.slice.kind == SliceSpec::Kind::Gpu && c.gpu_label == "nvidia") {
    c.slice.accelerator_key = "nvidia.com/gpu.product";
    c.slice.accelerator_value = c.slice.gpu->product;
  }
}

ClusterSpec read_cluster(const std::string& origin, const std::map<std::string, std::string>& raw) {
  Reader rd{origin, raw};
  OLMO_CHECK(!raw.empty(), rd.where("cluster"), ": missing (required)");
  rd.only_known(kClusterKeys, kStopKeys);
  auto need = [&](const std::string& key) {
    auto v = rd.get(key);
    OLMO_CHECK(v.has_value(), rd.where("cluster." + key), ": missing (required)");
    return *v;
  };
  ClusterSpec c;
  if (auto v = rd.get("namespace")) c.namespace_ = *v;
  OLMO_CHECK(dns1123_label(c.namespace_), rd.where("cluster.namespace"), ": '", c.namespace_,
             "' is not a valid namespace name (lowercase letters, digits, '-', at most 63)");
  c.queue = need("queue");
  OLMO_CHECK(dns1123_label(c.queue), rd.where("cluster.queue"), ": '", c.queue,
             "' is not a valid LocalQueue name");
  c.image = need("image");
  OLMO_CHECK(c.image.find(' ') == std::string::npos, rd.where("cluster.image"),
             ": expected an image reference");
  read_slice(rd, c);
  c.host_network = c.slice.multi_host_tpu();
  if (rd.get("host_network")) c.host_network = rd.boolean("host_network");
  if (auto v = rd.get("node_pool")) c.node_pool = *v;
  if (c.slice.kind == SliceSpec::Kind::Tpu) c.exclusive_topology = "cloud.google.com/gke-nodepool";
  if (raw.count("exclusive_topology")) c.exclusive_topology = raw.at("exclusive_topology");  // null: none
  if (rd.get("max_restarts")) c.max_restarts = static_cast<int>(rd.integer("max_restarts", 0, 1000));
  if (auto v = rd.get("service_account")) c.service_account = *v;
  if (auto v = rd.get("container")) c.container = *v;
  OLMO_CHECK(dns1123_label(c.container), rd.where("cluster.container"), ": not a valid container name");
  if (auto v = rd.get("command")) {
    YAML::Node list;
    try {
      list = YAML::Load(*v);
    } catch (const YAML::Exception&) {
    }
    OLMO_CHECK(list.IsSequence() && list.size() > 0, rd.where("cluster.command"),
               ": expected a non-empty list of strings");
    for (const auto& a : list) {
      OLMO_CHECK(a.IsScalar(), rd.where("cluster.command[]"), ": expected a string");
      c.command.push_back(a.Scalar());
    }
  } else {
    c.command = {"olmosft", "train", "/etc/olmosft/recipe.yaml"};
  }
  if (rd.get("allow_cpu_on_accelerator_hosts"))
    c.allow_cpu_on_accelerator_hosts = rd.boolean("allow_cpu_on_accelerator_hosts");
  if (auto v = rd.get("nccl_socket_ifname")) c.nccl_socket_ifname = *v;
  OLMO_CHECK(!c.nccl_socket_ifname.empty() && c.nccl_socket_ifname.size() < 256 &&
                 c.nccl_socket_ifname.find_first_of(" \t\n") == std::string::npos,
             rd.where("cluster.nccl_socket_ifname"),
             ": expected an interface name or NCCL's list form (eth0, ^lo)");
  if (rd.get("coordinator_port"))
    c.coordinator_port = static_cast<int>(rd.integer("coordinator_port", 1, 65535));
  if (rd.get("stop_rules.nan_loss")) c.stop_rules.nan_loss = rd.boolean("stop_rules.nan_loss");
  if (rd.get("stop_rules.max_required_rbf")) {
    double v = rd.number("stop_rules.max_required_rbf");
    OLMO_CHECK(v > 0, rd.where("cluster.stop_rules.max_required_rbf"), ": must be > 0");
    c.stop_rules.max_required_rbf = v;
  }
  if (rd.get("stop_rules.stall_minutes")) {
    double v = rd.number("stop_rules.stall_minutes");
    OLMO_CHECK(v > 0, rd.where("cluster.stop_rules.stall_minutes"), ": must be > 0");
    c.stop_rules.stall_minutes = v;
  }
  return c;
}

}  // namespace

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
  // Keys the trainer defaults but a cluster run must state (an output_dir of "runs" would be pod-local).
  for (const char* key : {"run_name", "seq_len", "global_batch", "per_device_batch", "steps", "output_dir"}) {
    OLMO_CHECK(r.root[key] && !r.root[key].IsNull(), origin, ": key '", key, "': missing (required)");
  }
  // The pod runs `olmosft train` on this same file: every trainer key is read now with the trainer's own
  // reader (unknown keys, types, ranges), so a typo fails the launch instead of a pod after scheduling.
  const std::string as_trainer = origin + " (as `olmosft train` reads it)";
  r.train = olmosft::Recipe::parse(r.effective_yaml(), as_trainer).fields();
  OLMO_CHECK(!r.train.run_name.empty(), origin, ": key 'run_name': must not be empty");
  r.cluster = read_cluster(origin, r.train.cluster);
  // The devices the trainer divides the batch by are the slice's: set in the mounted recipe.
  const int64_t devices = r.cluster.slice.devices();
  if (r.train.given.count("devices")) {
    OLMO_CHECK(r.train.batch.devices == devices, origin, ": key 'devices': ", r.train.batch.devices,
               " but slice ", r.cluster.slice.text, " has ", devices,
               " devices (drop the key: the launcher sets it from the slice)");
  } else {
    r.root["devices"] = devices;
  }
  check_fits(r);
  // What the pods will read, read back (devices included).
  r.train = olmosft::Recipe::parse(r.effective_yaml(), as_trainer).config();
  // What the pod's `olmosft train` would refuse, refused now; the device is judged by
  // accelerator_warnings when rendering.
  olmosft::require_run_inputs(r.train, /*model_from_recipe=*/true, /*check_device=*/false);
  return r;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path, std::ios::binary);
  OLMO_CHECK(f, "recipe ", path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_recipe(ss.str(), path, overrides);
}

std::vector<std::string> accelerator_warnings(const Recipe& r) {
  const SliceSpec& s = r.cluster.slice;
  const bool tpu = s.kind == SliceSpec::Kind::Tpu;
  const std::string what = std::to_string(s.devices()) + (tpu ? " TPU chips" : " GPUs") + " of " + s.text +
                           " (" + std::to_string(s.hosts) + " pods)";
  OLMO_CHECK(!(tpu && r.train.device == "cuda"), r.origin, ": key 'device': cuda on TPU slice ", s.text,
             " (device=cuda needs NVIDIA GPU nodes: cluster.accelerator)");
  if (r.train.device == "cuda") {
    return {
        "WARNING: device=cuda: this olmosft build trains on CPU only (no CUDA training backend yet, issue "
        "#15). These manifests are what a CUDA build needs for the " +
        what +
        "; run with this build's image, every pod would fail at preflight with 'device=cuda: this "
        "build has no CUDA training backend yet'."};
  }
  OLMO_CHECK(r.cluster.allow_cpu_on_accelerator_hosts, r.origin, ": key 'cluster.",
             tpu ? "slice" : "accelerator", "': ", s.text, " (", s.devices(),
             tpu ? " TPU chips, " : " GPUs, ", s.hosts, " pods): this olmosft build ",
             tpu ? "cannot use TPUs" : "trains on CPU only (device=cpu)",
             ": its pods would train on the hosts' CPUs and leave the accelerators idle. Set "
             "cluster.allow_cpu_on_accelerator_hosts=true to render it anyway",
             tpu ? "" : ", or device: cuda for the manifests a CUDA build needs");
  return {"WARNING: CPU TRAINING ON ACCELERATOR HOSTS: this olmosft build " +
          std::string(tpu ? "cannot use TPUs" : "trains on CPU only (device=cpu)") + ": the " + what +
          " stay idle and every pod trains on its host's CPUs "
          "(cluster.allow_cpu_on_accelerator_hosts=true)."};
}

}  // namespace olmosft::cluster
