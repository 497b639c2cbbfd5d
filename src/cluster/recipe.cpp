#include "cluster/recipe.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "cluster/recipe_keys.h"
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
    OLMO_CHECK(parse_integer(d, v) && v >= 1 && v <= 4096, "slice '", text, "': bad shape '", shape, "'; ",
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

namespace {

// device=xla with an accelerator's plugin: one device per process for now (docs/xla.md).
std::vector<std::string> xla_on_accelerators(const Recipe& r, const std::string& what) {
  const SliceSpec& s = r.cluster.slice;
  const bool tpu = s.kind == SliceSpec::Kind::Tpu;
  const std::string& plugin = r.train.xla.plugin;
  OLMO_CHECK(plugin != (tpu ? "cuda" : "tpu"), r.origin, ": key 'xla.plugin': ", plugin, " on ",
             tpu ? "TPU slice " : "GPU nodes ", s.text, " (",
             tpu ? "TPU chips need xla.plugin: tpu" : "NVIDIA GPUs need xla.plugin: cuda", ")");
  OLMO_CHECK(r.train.dist.mode == "dp", r.origin, ": key 'dist.mode': ", r.train.dist.mode,
             " with device=xla (the XLA backend holds every parameter on each process: dist.mode dp)");
  const int64_t per = s.devices_per_host;
  const char* unit = tpu ? " TPU chips" : " GPUs";
  if (!r.train.mesh.empty()) {  // one SPMD program over the mesh, which covers the slice (checked on parse)
    const xla::Mesh m = xla_mesh(r.train);
    if (s.hosts == 1) return {};
    return {"WARNING: device=xla on the " + what + ": the mesh (" + m.text() + ") is one SPMD program over " +
            std::to_string(m.devices()) + unit + " on " + std::to_string(s.hosts) +
            " hosts, and this build runs a mesh inside one process only (the multi-host runtime, one client "
            "over every host's devices each process feeding its own, is not written yet): each pod's olmosft "
            "train refuses when it builds the model, its client addressing the " +
            std::to_string(per) + unit +
            " of its own host. `olmosft plan --compile` checks the program for "
            "the slice."};
  }
  const int64_t used = r.train.xla.devices;
  OLMO_CHECK(used <= per, r.origin, ": key 'xla.devices': ", used, " but the pods of ", s.text, " have ", per,
             unit, " each");
  std::string w = "WARNING: device=xla on the " + what + ": each pod runs one olmosft process on " +
                  std::to_string(used) + " of its host's " + std::to_string(per) + unit +
                  " (xla.devices: one data-parallel SPMD program, parameters " +
                  (r.train.xla.shard_params ? "split over them" : "replicated") + ", docs/xla.md)";
  if (used < per) w += ", so " + std::to_string(per - used) + " of them stay idle";
  if (s.hosts > 1) w += "; the pods do not form one training job yet (no multi-host launcher)";
  return {w + "."};
}

}  // namespace

std::vector<std::string> accelerator_warnings(const Recipe& r) {
  const SliceSpec& s = r.cluster.slice;
  const bool tpu = s.kind == SliceSpec::Kind::Tpu;
  const std::string what = std::to_string(s.devices()) + (tpu ? " TPU chips" : " GPUs") + " of " + s.text +
                           " (" + std::to_string(s.hosts) + " pods)";
  OLMO_CHECK(!(tpu && r.train.device == "cuda"), r.origin, ": key 'device': cuda on TPU slice ", s.text,
             " (device=cuda needs NVIDIA GPU nodes: cluster.accelerator)");
  if (r.train.device == "cuda") {
    return {
        "WARNING: device=cuda: olmosft has no hand-written CUDA backend (GPUs train with device: xla and "
        "xla.plugin: cuda). These manifests are the GPU JobSet for the " +
        what +
        "; run with this image, every pod would fail at preflight with 'device=cuda: olmosft has no "
        "hand-written CUDA backend'."};
  }
  if (r.train.device == "xla" && r.train.xla.plugin != "cpu") return xla_on_accelerators(r, what);
  // The hosts' CPUs: device=cpu, or device=xla on XLA's CPU plugin.
  const std::string on_cpu = r.train.device == "xla" ? "device=xla with xla.plugin=cpu" : "device=cpu";
  OLMO_CHECK(
      r.cluster.allow_cpu_on_accelerator_hosts, r.origin, ": key 'cluster.", tpu ? "slice" : "accelerator",
      "': ", s.text, " (", s.devices(), tpu ? " TPU chips, " : " GPUs, ", s.hosts, " pods): ", on_cpu,
      " would train on the hosts' CPUs and leave the accelerators idle. Set device: xla with "
      "xla.plugin: ",
      tpu ? "tpu" : "cuda",
      " to train on them (xla.devices of them per pod), or cluster.allow_cpu_on_accelerator_hosts=true to "
      "render it anyway");
  return {"WARNING: CPU TRAINING ON ACCELERATOR HOSTS: " + on_cpu + ": the " + what +
          " stay idle and every pod trains on its host's CPUs "
          "(cluster.allow_cpu_on_accelerator_hosts=true)."};
}

}  // namespace olmosft::cluster
