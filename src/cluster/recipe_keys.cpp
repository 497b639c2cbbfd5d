// The `cluster.*` key table and the reader that goes through it (cluster/recipe_keys.h).
#include "cluster/recipe_keys.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "core/error.h"

namespace olmosft::cluster {

bool parse_integer(const std::string& s, int64_t& v) {
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

namespace {

constexpr const char* kSection = "cluster";  // the rows' names start with "cluster."
constexpr int kDefaultNodes = 1;             // cluster.nodes without the key (with cluster.accelerator)
constexpr const char* kTpuExclusiveTopology = "cloud.google.com/gke-nodepool";

// The field a row reads into, e.g. CLUSTER_FIELD(spec.queue).
#define CLUSTER_FIELD(member) \
  [](ClusterValues & v) -> auto& { return v.member; }

using Read = std::function<void(ClusterValues&, const std::string&, const std::string&)>;

ClusterKey row(const char* name, KeyType type, Absent absent, const std::string& def, const char* doc,
               Read read) {
  ClusterKey k;
  k.name = name;
  k.type = type;
  k.default_value = absent == Absent::Required ? "(required)" : def;
  k.doc = doc;
  k.on_resume = OnResume::Operational;
  k.absent = absent;
  k.read = std::move(read);
  return k;
}

int64_t integer(const std::string& s, int64_t lo, int64_t hi, const std::string& where) {
  int64_t v = 0;
  OLMO_CHECK(parse_integer(s, v), where, ": expected an integer, got '", s, "'");
  OLMO_CHECK(v >= lo && v <= hi, where, ": ", v, " is out of range [", lo, ", ", hi, "]");
  return v;
}

// YAML's spellings of a boolean (a recipe's `yes` reaches here as text).
bool boolean(const std::string& s, const std::string& where) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "true" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "no" || l == "off") return false;
  fail(where, ": expected true or false, got '", s, "'");
}

// DNS-1123 label check for namespace / queue / container names (what the API server requires of them).
bool dns1123_label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return s.front() != '-' && s.back() != '-';
}

// A string; `check` (when given) refuses a bad value with its own words after "WHERE: ".
template <typename Get>
ClusterKey text(const char* name, Absent absent, const std::string& def, const char* doc, Get get,
                std::function<void(const std::string& v, const std::string& where)> check = nullptr) {
  return row(name, KeyType::String, absent, def, doc,
             [get, check](ClusterValues& c, const std::string& v, const std::string& where) {
               if (check) check(v, where);
               get(c) = v;
             });
}

template <typename Get>
ClusterKey int_key(const char* name, Absent absent, const std::string& def, const char* doc, int64_t lo,
                   int64_t hi, Get get) {
  return row(name, KeyType::Int, absent, def, doc,
             [lo, hi, get](ClusterValues& c, const std::string& v, const std::string& where) {
               get(c) = static_cast<int>(integer(v, lo, hi, where));
             });
}

template <typename Get>
ClusterKey flag(const char* name, Absent absent, const char* def, const char* doc, Get get) {
  return row(name, KeyType::Bool, absent, def, doc,
             [get](ClusterValues& c, const std::string& v, const std::string& where) {
               get(c) = boolean(v, where);
             });
}

// A finite number > 0, or no rule when left out.
template <typename Get>
ClusterKey positive(const char* name, const char* doc, Get get) {
  return row(name, KeyType::Float, Absent::Optional, "(none)", doc,
             [get](ClusterValues& c, const std::string& s, const std::string& where) {
               char* end = nullptr;
               const double v = std::strtod(s.c_str(), &end);
               OLMO_CHECK(!s.empty() && end == s.c_str() + s.size() && std::isfinite(v), where,
                          ": expected a finite number, got '", s, "'");
               OLMO_CHECK(v > 0, where, ": must be > 0");
               get(c) = v;
             });
}

// The container command: a non-empty YAML list of strings (the trainer's flatten passes a list as YAML).
void read_command(ClusterValues& c, const std::string& text, const std::string& where) {
  YAML::Node list;
  try {
    list = YAML::Load(text);
  } catch (const YAML::Exception&) {
  }
  OLMO_CHECK(list.IsSequence() && list.size() > 0, where, ": expected a non-empty list of strings");
  c.spec.command.clear();
  for (const auto& a : list) {
    OLMO_CHECK(a.IsScalar(), where, ": expected a list of strings, got an item that is not a string");
    c.spec.command.push_back(a.Scalar());
  }
}

// Where the run is queued and what it runs.
std::vector<ClusterKey> placement_keys() {
  return {
      text("cluster.namespace", Absent::Default, "default", "namespace of every object",
           CLUSTER_FIELD(spec.namespace_),
           [](const std::string& v, const std::string& where) {
             OLMO_CHECK(dns1123_label(v), where, ": '", v,
                        "' is not a valid namespace name (lowercase letters, digits, '-', at most 63)");
           }),
      text("cluster.queue", Absent::Required, "", "Kueue LocalQueue (label kueue.x-k8s.io/queue-name)",
           CLUSTER_FIELD(spec.queue),
           [](const std::string& v, const std::string& where) {
             OLMO_CHECK(dns1123_label(v), where, ": '", v, "' is not a valid LocalQueue name");
           }),
      text("cluster.image", Absent::Required, "", "container image", CLUSTER_FIELD(spec.image),
           [](const std::string& v, const std::string& where) {
             OLMO_CHECK(v.find(' ') == std::string::npos, where, ": expected an image reference");
           }),
  };
}

// The nodes: the slice (TPU, or GPU nodes by type and count), how they are selected and networked.
std::vector<ClusterKey> node_keys() {
  return {
      row("cluster.slice", KeyType::String, Absent::Optional, "(none)",
          "tpu-<v4|v5p|v5e|v6e>-<topology> (e.g. tpu-v4-4x4x8), or GPU nodes as gpu-<model>-<nodes>x<gpus>; "
          "one of cluster.slice / cluster.accelerator is required",
          [](ClusterValues& c, const std::string& v, const std::string& where) {
            try {
              c.slice = parse_slice(v);
            } catch (const Error& e) {
              fail(where, ": ", e.what());
            }
          }),
      row("cluster.accelerator", KeyType::String, Absent::Optional, "(none)",
          "GPU nodes by type: a GKE accelerator label value, e.g. nvidia-h200-141gb (docs/k8s.md has the "
          "table); not with cluster.slice",
          [](ClusterValues& c, const std::string& v, const std::string& where) {
            OLMO_CHECK(!c.slice, where,
                       ": give cluster.slice (a TPU slice) or cluster.accelerator (GPU nodes), not both");
            try {
              c.accelerator = &find_gpu_type(v);
            } catch (const Error& e) {
              fail(where, ": ", e.what());
            }
          }),
      row("cluster.nodes", KeyType::Int, Absent::Optional,
          "(" + std::to_string(kDefaultNodes) + " with cluster.accelerator)",
          "GPU nodes (pods), each with all of the type's GPUs; only with cluster.accelerator",
          [](ClusterValues& c, const std::string& v, const std::string& where) {
            OLMO_CHECK(!c.slice, where,
                       ": only with cluster.accelerator (a slice string carries its own shape)");
            c.nodes = static_cast<int>(integer(v, 1, 4096, where));
          }),
      text("cluster.gpu_label", Absent::Default, "gke",
           "GPU node selector: gke (cloud.google.com/gke-accelerator) or nvidia (nvidia.com/gpu.product, set "
           "by NVIDIA GPU Feature Discovery on any cluster)",
           CLUSTER_FIELD(spec.gpu_label),
           [](const std::string& v, const std::string& where) {
             OLMO_CHECK(
                 v == "gke" || v == "nvidia", where,
                 ": expected gke (cloud.google.com/gke-accelerator) or nvidia (nvidia.com/gpu.product), "
                 "got '",
                 v, "'");
           }),
      text("cluster.nccl_socket_ifname", Absent::Default, "eth0",
           "GPU: NCCL_SOCKET_IFNAME (an interface name or NCCL's list form, e.g. ^lo,docker)",
           CLUSTER_FIELD(spec.nccl_socket_ifname),
           [](const std::string& v, const std::string& where) {
             OLMO_CHECK(!v.empty() && v.size() < 256 && v.find_first_of(" \t\n") == std::string::npos, where,
                        ": expected an interface name or NCCL's list form (eth0, ^lo)");
           }),
      flag("cluster.allow_cpu_on_accelerator_hosts", Absent::Default, "false",
           "render a TPU slice, or GPU nodes with device: cpu, although this build would train on the hosts' "
           "CPUs (warned about)",
           CLUSTER_FIELD(spec.allow_cpu_on_accelerator_hosts)),
      flag("cluster.host_network", Absent::Optional, "(true for a multi-host TPU slice, else false)",
           "hostNetwork: true + dnsPolicy: ClusterFirstWithHostNet", CLUSTER_FIELD(host_network)),
      text("cluster.node_pool", Absent::Default, "", "pin to one node pool (cloud.google.com/gke-nodepool)",
           CLUSTER_FIELD(spec.node_pool)),
      text("cluster.exclusive_topology", Absent::NullIsNone,
           std::string("(") + kTpuExclusiveTopology + " for TPU, none for GPU; null: none)",
           "node label for the JobSet annotation alpha.jobset.sigs.k8s.io/exclusive-topology (one slice per "
           "node pool)",
           CLUSTER_FIELD(exclusive_topology)),
  };
}

// The JobSet and its pods.
std::vector<ClusterKey> pod_keys() {
  return {
      int_key("cluster.max_restarts", Absent::Default, "3", "JobSet failurePolicy.maxRestarts", 0, 1000,
              CLUSTER_FIELD(spec.max_restarts)),
      text("cluster.service_account", Absent::Default, "", "pod serviceAccountName (empty: the namespace's)",
           CLUSTER_FIELD(spec.service_account)),
      text("cluster.container", Absent::Default, "trainer",
           "container name (also the one `k8s watch` follows)", CLUSTER_FIELD(spec.container),
           [](const std::string& v, const std::string& where) {
             OLMO_CHECK(dns1123_label(v), where, ": not a valid container name");
           }),
      row("cluster.command", KeyType::List, Absent::Default, "[olmosft, train, /etc/olmosft/recipe.yaml]",
          "container command (a list of strings)", read_command),
      int_key("cluster.coordinator_port", Absent::Default, "29500", "rendezvous port on pod 0", 1, 65535,
              CLUSTER_FIELD(spec.coordinator_port)),
  };
}

// `k8s watch`'s rules for stopping a run.
std::vector<ClusterKey> stop_rule_keys() {
  return {
      flag("cluster.stop_rules.nan_loss", Absent::Default, "true", "stop when a LOSS-PARTS value is NaN/inf",
           CLUSTER_FIELD(spec.stop_rules.nan_loss)),
      positive("cluster.stop_rules.max_required_rbf",
               "stop when a trainer `REQUIRED_RBF step=N value=X` line has X above this",
               CLUSTER_FIELD(spec.stop_rules.max_required_rbf)),
      positive("cluster.stop_rules.stall_minutes", "stop when no new step arrives for this long (minutes)",
               CLUSTER_FIELD(spec.stop_rules.stall_minutes)),
  };
}

#undef CLUSTER_FIELD

std::string where(const std::string& origin, const std::string& key) {
  return origin + ": key '" + key + "'";
}

// Whether `name` holds rows below it ("cluster", "cluster.stop_rules").
bool is_section(const std::string& name) {
  for (const auto& k : cluster_keys())
    if (k.name.rfind(name + ".", 0) == 0) return true;
  return false;
}

// The keys directly under a section, in table order: "namespace, queue, ..., stop_rules".
std::string children(const std::string& section) {
  std::vector<std::string> seen;
  for (const auto& k : cluster_keys()) {
    if (k.name.rfind(section + ".", 0) != 0) continue;
    const std::string rest = k.name.substr(section.size() + 1);
    const std::string child = rest.substr(0, rest.find('.'));
    if (std::find(seen.begin(), seen.end(), child) == seen.end()) seen.push_back(child);
  }
  std::string list;
  for (const auto& c : seen) list += (list.empty() ? "" : ", ") + c;
  return list;
}

// Every given key is a row, or a section given as a map (or null); anything else is refused naming the first
// component that is not known, with what is allowed there.
void check_known(const std::string& origin, const std::string& key, const std::string& value) {
  if (find_cluster_key(key)) return;
  std::string section = kSection;
  for (size_t dot = section.size();;) {
    const size_t next = key.find('.', dot + 1);
    const std::string head = key.substr(0, next);
    if (find_cluster_key(head)) fail(where(origin, head), ": expected a single value, not a map");
    if (!is_section(head))
      fail(where(origin, head), ": unknown key (allowed under '", section, "': ", children(section), ")");
    if (next == std::string::npos) {
      OLMO_CHECK(value.empty(), where(origin, head), ": expected a map (", children(head), ")");
      return;
    }
    section = head;
    dot = next;
  }
}

// What the keys decide together: the slice and its node selector, and the defaults that follow the slice.
void combine(ClusterValues& v, const std::string& origin) {
  OLMO_CHECK(v.slice || v.accelerator, where(origin, "cluster.slice"),
             ": missing (required: cluster.slice for a TPU slice, or cluster.accelerator for GPU nodes)");
  ClusterSpec& c = v.spec;
  c.slice = v.slice ? *v.slice : gpu_slice(*v.accelerator, v.nodes.value_or(kDefaultNodes));
  if (c.slice.kind == SliceSpec::Kind::Gpu && c.gpu_label == "nvidia") {
    c.slice.accelerator_key = "nvidia.com/gpu.product";
    c.slice.accelerator_value = c.slice.gpu->product;
  }
  c.host_network = v.host_network.value_or(c.slice.multi_host_tpu());
  c.exclusive_topology =
      v.exclusive_topology.value_or(c.slice.kind == SliceSpec::Kind::Tpu ? kTpuExclusiveTopology : "");
}

}  // namespace

const std::vector<ClusterKey>& cluster_keys() {
  // Read in this order: cluster.nodes and cluster.accelerator look at cluster.slice.
  static const std::vector<ClusterKey> keys = [] {
    std::vector<ClusterKey> all;
    for (auto part : {placement_keys, node_keys, pod_keys, stop_rule_keys}) {
      auto k = part();
      all.insert(all.end(), std::make_move_iterator(k.begin()), std::make_move_iterator(k.end()));
    }
    return all;
  }();
  return keys;
}

const ClusterKey* find_cluster_key(const std::string& name) {
  for (const auto& k : cluster_keys())
    if (k.name == name) return &k;
  return nullptr;
}

ClusterSpec read_cluster(const std::string& origin, const std::map<std::string, std::string>& raw) {
  OLMO_CHECK(!raw.empty(), where(origin, kSection), ": missing (required)");
  const std::string prefix = std::string(kSection) + ".";
  for (const auto& [k, v] : raw) check_known(origin, prefix + k, v);
  ClusterValues values;
  for (const ClusterKey& k : cluster_keys()) {
    const auto it = raw.find(k.name.substr(prefix.size()));
    const bool given = it != raw.end() && (!it->second.empty() || k.absent == Absent::NullIsNone);
    if (given) {
      k.read(values, it->second, where(origin, k.name));
    } else if (k.absent == Absent::Required) {
      fail(where(origin, k.name), ": missing (required)");
    } else if (k.absent == Absent::Default) {
      k.read(values, k.default_value, where(origin, k.name));
    }
  }
  combine(values, origin);
  return values.spec;
}

}  // namespace olmosft::cluster
