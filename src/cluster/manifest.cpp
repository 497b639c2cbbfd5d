#include "cluster/manifest.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace olmosft::cluster {

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

int digits(int n) { return n < 10 ? 1 : 1 + digits(n / 10); }

bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), ::tolower);
  static const char* words[] = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"};
  for (const char* w : words)
    if (l == w) return true;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  if (end == s.c_str() + s.size()) return true;  // parses fully as a number (also inf/nan forms)
  if (l == ".inf" || l == "-.inf" || l == ".nan") return true;
  // yaml-cpp quotes strings with special characters itself; leading/trailing spaces need quotes too.
  return s.front() == ' ' || s.back() == ' ';
}

void emit(YAML::Emitter& e, const OJson& j) {
  switch (j.type()) {
    case OJson::value_t::object:
      e << YAML::BeginMap;
      for (auto it = j.begin(); it != j.end(); ++it) {
        e << YAML::Key << it.key() << YAML::Value;
        emit(e, it.value());
      }
      e << YAML::EndMap;
      break;
    case OJson::value_t::array:
      e << YAML::BeginSeq;
      for (const auto& x : j) emit(e, x);
      e << YAML::EndSeq;
      break;
    case OJson::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      if (s.find('\n') != std::string::npos)
        e << YAML::Literal << s;
      else if (needs_quotes(s))
        e << YAML::DoubleQuoted << s;
      else
        e << s;
      break;
    }
    case OJson::value_t::boolean:
      e << (j.get<bool>() ? "true" : "false");
      break;
    case OJson::value_t::number_integer:
      e << j.get<int64_t>();
      break;
    case OJson::value_t::number_unsigned:
      e << j.get<uint64_t>();
      break;
    case OJson::value_t::number_float:
      e << j.get<double>();
      break;
    case OJson::value_t::null:
      e << YAML::Null;
      break;
    default:
      fail("manifest: cannot emit a value of JSON type ", j.type_name());
  }
}

OJson env_field(const std::string& name, const std::string& path) {
  return OJson{{"name", name}, {"valueFrom", {{"fieldRef", {{"fieldPath", path}}}}}};
}

// GPU pods: one per node (a required anti-affinity on the run's label, besides taking every GPU of the
// node), the GPU nodes' taint tolerated, and /dev/shm as memory (NCCL's intra-node shared-memory transport;
// a container's default /dev/shm is 64 MiB).
void add_gpu_pod_parts(const std::string& js, OJson& pod_spec) {
  pod_spec["affinity"] = {{"podAntiAffinity",
                           {{"requiredDuringSchedulingIgnoredDuringExecution",
                             OJson::array({{{"labelSelector", {{"matchLabels", {{"olmosft.io/run", js}}}}},
                                            {"topologyKey", "kubernetes.io/hostname"}}})}}}};
  pod_spec["tolerations"] =
      OJson::array({{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}});
  pod_spec["containers"][0]["volumeMounts"].push_back({{"name", "dshm"}, {"mountPath", "/dev/shm"}});
  pod_spec["volumes"].push_back({{"name", "dshm"}, {"emptyDir", {{"medium", "Memory"}}}});
}

// GPU launcher environment: one process per GPU, world = nodes x GPUs, NCCL bootstrapped from pod 0's DNS
// name (NCCL_COMM_ID: rank 0 starts NCCL's bootstrap root there; docs/reference/cluster_ops.md 5.3), sockets
// on the pod's interface, NVLink SHARP off (its reductions vary between calls: nccl#1497).
void add_gpu_env(const Recipe& r, const Rendered& out, OJson& data) {
  const SliceSpec& s = r.cluster.slice;
  data["OLMOSFT_DEVICE"] = r.train.device;
  data["OLMOSFT_WORLD_SIZE"] = std::to_string(s.devices());
  data["OLMOSFT_LOCAL_WORLD_SIZE"] = std::to_string(s.devices_per_host);
  data["NCCL_COMM_ID"] = out.coordinator;
  data["NCCL_SOCKET_IFNAME"] = r.cluster.nccl_socket_ifname;
  data["NCCL_NVLS_ENABLE"] = "0";
  data["NCCL_DEBUG"] = "WARN";
}

// device: xla on a TPU slice: libtpu's multi-host identity, which it reads from the environment (not from
// client create options): TPU_WORKER_HOSTNAMES, every pod's host name through the JobSet's headless service
// in worker (completion index) order, and TPU_WORKER_ID, this pod's completion index (added to the
// container's env). GKE's TPU webhook sets the same two where it runs; set here they do not depend on it.
void add_tpu_env(const Recipe& r, const Rendered& out, OJson& data) {
  std::string hosts;
  for (int i = 0; i < r.cluster.slice.hosts; ++i)
    hosts += (i ? "," : "") + out.jobset_name + "-" + out.replicated_job + "-0-" + std::to_string(i) + "." +
             out.subdomain;
  data["OLMOSFT_DEVICE"] = r.train.device;
  data["TPU_WORKER_HOSTNAMES"] = hosts;
}

}  // namespace

bool is_dns1035_label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  if (!(s.front() >= 'a' && s.front() <= 'z')) return false;
  if (s.back() == '-') return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

std::string make_jobset_name(const std::string& run_name, const std::string& suffix, const std::string& rjob,
                             int replicas, int pods_per_job) {
  OLMO_CHECK(!suffix.empty() && suffix.size() <= 8, "name suffix '", suffix, "': expected 1..8 characters");
  for (char c : suffix)
    OLMO_CHECK((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'), "name suffix '", suffix,
               "': only lowercase letters and digits are allowed");
  std::string base;
  for (char c : run_name) {
    char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bool ok = (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9');
    if (ok)
      base += l;
    else if (!base.empty() && base.back() != '-')
      base += '-';
  }
  while (!base.empty() && base.back() == '-') base.pop_back();
  if (base.empty() || !(base.front() >= 'a' && base.front() <= 'z')) base = "r" + base;
  // Longest pod hostname: <name>-<rjob>-<replicas-1>-<pods-1> <= 63 (the JobSet webhook rejects more).
  const int overhead = 1 + static_cast<int>(rjob.size()) + 1 + digits(std::max(0, replicas - 1)) + 1 +
                       digits(std::max(0, pods_per_job - 1));
  const int max_name = 63 - overhead;
  const int max_base = max_name - 1 - static_cast<int>(suffix.size());
  OLMO_CHECK(max_base >= 1, "run name: no room for a name with suffix '", suffix, "'");
  if (static_cast<int>(base.size()) > max_base) base.resize(max_base);
  while (!base.empty() && base.back() == '-') base.pop_back();
  std::string name = base + "-" + suffix;
  OLMO_CHECK(is_dns1035_label(name), "internal: generated name '", name, "' is not DNS-1035");
  return name;
}

Rendered render(const Recipe& r, const RenderOptions& opt) {
  const ClusterSpec& c = r.cluster;
  const SliceSpec& s = c.slice;
  Rendered out;
  // Refused first: nothing is rendered for a slice this build would misuse without the recipe saying so.
  out.warnings = accelerator_warnings(r);
  out.replicated_job = s.kind == SliceSpec::Kind::Tpu ? "slice" : "node";
  std::string suffix = opt.suffix;
  if (suffix.empty()) {
    auto now = std::chrono::system_clock::now().time_since_epoch().count();
    uint64_t h = fnv1a(r.effective_yaml() + "@" + std::to_string(now));
    char buf[17];
    std::snprintf(buf, sizeof buf, "%06llx", static_cast<unsigned long long>(h & 0xffffff));
    suffix = buf;
  }
  const int replicas = 1;
  out.jobset_name = make_jobset_name(r.train.run_name, suffix, out.replicated_job, replicas, s.hosts);
  out.subdomain = out.jobset_name;
  const std::string& js = out.jobset_name;
  out.coordinator =
      js + "-" + out.replicated_job + "-0-0." + out.subdomain + ":" + std::to_string(c.coordinator_port);

  const OJson common_labels = {{"app.kubernetes.io/managed-by", "olmosft"}, {"olmosft.io/run", js}};

  // 1. The recipe (the trainer reads recipe.yaml; the source and the overrides are kept for the record).
  std::string overrides;
  for (const auto& o : r.overrides) overrides += o + "\n";
  OJson cm_recipe = {
      {"apiVersion", "v1"},
      {"kind", "ConfigMap"},
      {"metadata", {{"name", js + "-recipe"}, {"namespace", c.namespace_}, {"labels", common_labels}}},
      {"data",
       {{"recipe.yaml", r.effective_yaml()}, {"source.yaml", r.source_text}, {"overrides.txt", overrides}}}};

  // 2. Launcher environment (run facts and the pod layout, next to the downward-API variables).
  OJson cm_env = {
      {"apiVersion", "v1"},
      {"kind", "ConfigMap"},
      {"metadata", {{"name", js + "-env"}, {"namespace", c.namespace_}, {"labels", common_labels}}},
      {"data",
       {{"RUN_NAME", r.train.run_name},
        {"OLMOSFT_RUN_ID", js},
        {"OUTPUT_DIR", r.train.output_dir},
        {"OLMOSFT_RECIPE", "/etc/olmosft/recipe.yaml"},
        {"OLMOSFT_NUM_PODS", std::to_string(s.hosts * replicas)},
        {"OLMOSFT_PODS_PER_JOB", std::to_string(s.hosts)},
        {"OLMOSFT_DEVICES_PER_POD", std::to_string(s.devices_per_host)},
        {"OLMOSFT_SUBDOMAIN", out.subdomain},
        {"OLMOSFT_COORDINATOR_PORT", std::to_string(c.coordinator_port)},
        {"OLMOSFT_COORDINATOR", out.coordinator},
        {"OLMOSFT_CHECKPOINT_GRACE_SECONDS", std::to_string(r.train.checkpoint.grace_seconds)}}}};
  if (s.kind == SliceSpec::Kind::Gpu) add_gpu_env(r, out, cm_env["data"]);
  const bool libtpu = s.kind == SliceSpec::Kind::Tpu && r.train.device == "xla";
  if (libtpu) add_tpu_env(r, out, cm_env["data"]);

  // 3. The JobSet.
  OJson container = {
      {"name", c.container},
      {"image", c.image},
      {"command", c.command},
      {"envFrom", OJson::array({{{"configMapRef", {{"name", js + "-env"}}}}})},
      {"env",
       OJson::array(
           {env_field("JOBSET_NAME", "metadata.labels['jobset.sigs.k8s.io/jobset-name']"),
            env_field("REPLICATED_JOB_NAME", "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']"),
            env_field("JOB_INDEX", "metadata.labels['jobset.sigs.k8s.io/job-index']"),
            env_field("RESTART_ATTEMPT", "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"),
            env_field("OLMOSFT_NODE_RANK",
                      "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
            env_field("POD_NAME", "metadata.name"), env_field("POD_NAMESPACE", "metadata.namespace")})},
      {"ports", OJson::array({{{"name", "coordinator"}, {"containerPort", c.coordinator_port}}})},
      {"resources",
       {{"requests", {{s.resource_name, std::to_string(s.devices_per_host)}}},
        {"limits", {{s.resource_name, std::to_string(s.devices_per_host)}}}}},
      {"volumeMounts",
       OJson::array({{{"name", "recipe"}, {"mountPath", "/etc/olmosft"}, {"readOnly", true}}})}};

  if (libtpu)
    container["env"].push_back(
        env_field("TPU_WORKER_ID", "metadata.annotations['batch.kubernetes.io/job-completion-index']"));

  OJson node_selector = {{s.accelerator_key, s.accelerator_value}};
  if (s.kind == SliceSpec::Kind::Tpu) node_selector["cloud.google.com/gke-tpu-topology"] = s.topology;
  if (!c.node_pool.empty()) node_selector["cloud.google.com/gke-nodepool"] = c.node_pool;

  OJson pod_spec = OJson::object();
  pod_spec["restartPolicy"] = "Never";
  pod_spec["terminationGracePeriodSeconds"] = r.train.checkpoint.grace_seconds;
  if (!c.service_account.empty()) pod_spec["serviceAccountName"] = c.service_account;
  if (c.host_network) {
    pod_spec["hostNetwork"] = true;
    pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet";
  }
  pod_spec["nodeSelector"] = node_selector;
  pod_spec["containers"] = OJson::array({container});
  pod_spec["volumes"] = OJson::array({{{"name", "recipe"}, {"configMap", {{"name", js + "-recipe"}}}}});
  if (s.kind == SliceSpec::Kind::Gpu) add_gpu_pod_parts(js, pod_spec);

  OJson job_spec = {{"parallelism", s.hosts},
                    {"completions", s.hosts},
                    {"completionMode", "Indexed"},
                    {"backoffLimit", 0},
                    {"template", {{"metadata", {{"labels", common_labels}}}, {"spec", pod_spec}}}};

  OJson labels = common_labels;
  labels["kueue.x-k8s.io/queue-name"] = c.queue;
  OJson meta = {{"name", js}, {"namespace", c.namespace_}, {"labels", labels}};
  if (!c.exclusive_topology.empty())
    meta["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"] = c.exclusive_topology;
  if (!out.warnings.empty()) {  // what this build's pods would really do, on the object itself
    std::string w;
    for (const auto& line : out.warnings) w += (w.empty() ? "" : "\n") + line;
    meta["annotations"]["olmosft.io/warning"] = w;
  }

  OJson jobset = {
      {"apiVersion", "jobset.x-k8s.io/v1alpha2"},
      {"kind", "JobSet"},
      {"metadata", meta},
      {"spec",
       {{"failurePolicy", {{"maxRestarts", c.max_restarts}, {"restartStrategy", "BlockingRecreate"}}},
        {"successPolicy",
         {{"operator", "All"}, {"targetReplicatedJobs", OJson::array({out.replicated_job})}}},
        {"network",
         {{"enableDNSHostnames", true}, {"subdomain", out.subdomain}, {"publishNotReadyAddresses", true}}},
        {"replicatedJobs", OJson::array({{{"name", out.replicated_job},
                                          {"replicas", replicas},
                                          {"template", {{"spec", job_spec}}}}})}}}};

  out.objects.emplace_back("configmap-recipe", cm_recipe);
  out.objects.emplace_back("configmap-env", cm_env);
  out.objects.emplace_back("jobset", jobset);
  return out;
}

std::string to_yaml(const OJson& obj) {
  YAML::Emitter e;
  emit(e, obj);
  OLMO_CHECK(e.good(), "manifest: YAML emitter error: ", e.GetLastError());
  return std::string(e.c_str()) + "\n";
}

void write_rendered(const Rendered& out, const std::string& dir) {
  std::error_code ec;
  OLMO_CHECK(!std::filesystem::exists(dir, ec) || std::filesystem::is_empty(dir, ec), "--out ", dir,
             " is not empty: choose a new directory (manifests of two renders must not mix)");
  std::filesystem::create_directories(dir, ec);
  OLMO_CHECK(!ec, "--out ", dir, ": cannot create directory: ", ec.message());
  OJson all = {{"jobset", out.jobset_name},
               {"replicatedJob", out.replicated_job},
               {"subdomain", out.subdomain},
               {"coordinator", out.coordinator},
               {"objects", OJson::array()}};
  for (size_t i = 0; i < out.objects.size(); ++i) {
    const auto& [file, obj] = out.objects[i];
    io::write_file_atomic(dir + "/" + std::to_string(i) + "-" + file + ".yaml", to_yaml(obj));
    all["objects"].push_back({{"file", file}, {"object", obj}});
  }
  io::write_file_atomic(dir + "/manifest.json", all.dump(2) + "\n");
}

Rendered read_rendered(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream f(path);
  OLMO_CHECK(f, path, ": cannot open (render first: olmosft k8s render RECIPE --out ", dir, ")");
  OJson j;
  try {
    j = OJson::parse(f);
  } catch (const std::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  Rendered r;
  try {
    r.jobset_name = j.at("jobset").get<std::string>();
    r.replicated_job = j.at("replicatedJob").get<std::string>();
    r.subdomain = j.at("subdomain").get<std::string>();
    r.coordinator = j.at("coordinator").get<std::string>();
    for (const auto& o : j.at("objects"))
      r.objects.emplace_back(o.at("file").get<std::string>(), o.at("object"));
  } catch (const OJson::exception& e) {
    fail(path, ": unexpected layout (", e.what(), "); re-render it with olmosft k8s render");
  }
  OLMO_CHECK(!r.objects.empty() && r.objects.back().second.value("kind", "") == "JobSet", path,
             ": the last object must be the JobSet");
  return r;
}

}  // namespace olmosft::cluster
