// The `cluster.*` key table (cluster/recipe_keys.h): the only list of the launcher's keys, read through by
// parse_recipe, listed by `olmosft recipe keys`, documented in docs/k8s.md.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cluster/recipe_keys.h"
#include "core/error.h"

using namespace olmosft::cluster;
using olmosft::KeyType;

namespace {

const char* kBase = R"(run_name: test-run
model:
  init: /mnt/hf/base
data:
  path: /mnt/data/packed
seq_len: 65536
global_batch: 16
per_device_batch: 0.125
steps: 100
output_dir: /out
cluster:
  queue: post-training
  image: example.com/olmosft:1
  slice: tpu-v4-4x4x8
)";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const olmosft::Error& e) {
    return e.what();
  }
  return "";
}

// The keys directly below `section`, in table order, as the reader lists them: "namespace, queue, ...".
std::string children(const std::string& section) {
  std::vector<std::string> seen;
  for (const ClusterKey& k : cluster_keys()) {
    if (k.name.rfind(section + ".", 0) != 0) continue;
    std::string child = k.name.substr(section.size() + 1);
    child = child.substr(0, child.find('.'));
    if (std::find(seen.begin(), seen.end(), child) == seen.end()) seen.push_back(child);
  }
  std::string list;
  for (const auto& c : seen) list += (list.empty() ? "" : ", ") + c;
  return list;
}

}  // namespace

// One row per key the launcher reads: the names it has always accepted, each documented, operational (a
// resume may change it), not also a trainer key, and reading its default without complaint.
TEST(K8sRecipeKeys, OneTableWithTypesDefaultsDocsAndReaders) {
  std::set<std::string> names;
  for (const ClusterKey& k : cluster_keys()) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name << " twice";
    EXPECT_FALSE(k.doc.empty()) << k.name;
    EXPECT_EQ(k.on_resume, olmosft::OnResume::Operational) << k.name;
    EXPECT_TRUE(olmosft::recipe_key_operational(k.name)) << k.name;
    EXPECT_EQ(olmosft::find_recipe_key(k.name), nullptr) << k.name << " is a trainer key too";
    EXPECT_EQ(find_cluster_key(k.name), &k) << k.name;
    ASSERT_TRUE(k.read) << k.name;
    if (k.absent == Absent::Default) {
      ClusterValues v;
      EXPECT_NO_THROW(k.read(v, k.default_value, "t.yaml: key '" + k.name + "'")) << k.name;
    } else {  // no single default value: a description
      ASSERT_FALSE(k.default_value.empty()) << k.name;
      EXPECT_EQ(k.default_value.front(), '(') << k.name;
    }
  }
  const std::set<std::string> want = {"cluster.namespace",
                                      "cluster.queue",
                                      "cluster.image",
                                      "cluster.slice",
                                      "cluster.accelerator",
                                      "cluster.nodes",
                                      "cluster.gpu_label",
                                      "cluster.nccl_socket_ifname",
                                      "cluster.allow_cpu_on_accelerator_hosts",
                                      "cluster.host_network",
                                      "cluster.node_pool",
                                      "cluster.exclusive_topology",
                                      "cluster.max_restarts",
                                      "cluster.service_account",
                                      "cluster.container",
                                      "cluster.command",
                                      "cluster.coordinator_port",
                                      "cluster.stop_rules.nan_loss",
                                      "cluster.stop_rules.max_required_rbf",
                                      "cluster.stop_rules.stall_minutes"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(find_cluster_key("cluster.qeue"), nullptr);
  EXPECT_EQ(find_cluster_key("cluster.stop_rules"), nullptr);  // a section, not a key
}

// What a recipe that leaves the keys out gets: the table's defaults.
TEST(K8sRecipeKeys, DefaultsComeFromTheTable) {
  const ClusterSpec c = parse_recipe(kBase, "r.yaml", {}).cluster;
  EXPECT_EQ(c.namespace_, "default");
  EXPECT_EQ(c.gpu_label, "gke");
  EXPECT_EQ(c.nccl_socket_ifname, "eth0");
  EXPECT_FALSE(c.allow_cpu_on_accelerator_hosts);
  EXPECT_TRUE(c.host_network);  // multi-host TPU
  EXPECT_EQ(c.node_pool, "");
  EXPECT_EQ(c.exclusive_topology, "cloud.google.com/gke-nodepool");
  EXPECT_EQ(c.max_restarts, 3);
  EXPECT_EQ(c.service_account, "");
  EXPECT_EQ(c.container, "trainer");
  EXPECT_EQ(c.command, (std::vector<std::string>{"olmosft", "train", "/etc/olmosft/recipe.yaml"}));
  EXPECT_EQ(c.coordinator_port, 29500);
  EXPECT_TRUE(c.stop_rules.nan_loss);
  EXPECT_FALSE(c.stop_rules.max_required_rbf.has_value());
  EXPECT_FALSE(c.stop_rules.stall_minutes.has_value());
  // Each default given explicitly reads the same as leaving the key out.
  auto fields = [](const ClusterSpec& s) {
    std::ostringstream o;
    o << s.namespace_ << "|" << s.gpu_label << "|" << s.nccl_socket_ifname << "|"
      << s.allow_cpu_on_accelerator_hosts << "|" << s.node_pool << "|" << s.max_restarts << "|"
      << s.service_account << "|" << s.container << "|" << s.coordinator_port << "|" << s.stop_rules.nan_loss;
    for (const auto& a : s.command) o << "|" << a;
    return o.str();
  };
  for (const ClusterKey& k : cluster_keys()) {
    if (k.absent != Absent::Default) continue;
    EXPECT_EQ(fields(parse_recipe(kBase, "r.yaml", {k.name + "=" + k.default_value}).cluster), fields(c))
        << k.name;
  }
  // An explicit null for exclusive_topology means none; for the others it means the default.
  EXPECT_EQ(parse_recipe(kBase, "r.yaml", {"cluster.exclusive_topology=null"}).cluster.exclusive_topology,
            "");
  EXPECT_EQ(parse_recipe(kBase, "r.yaml", {"cluster.max_restarts=null"}).cluster.max_restarts, 3);
}

// A key that is not a row is refused naming it and every key allowed where it stands.
TEST(K8sRecipeKeys, UnknownKeyNamesItAndTheAllowedKeys) {
  const std::string top = children("cluster");
  EXPECT_EQ(top,
            "namespace, queue, image, slice, accelerator, nodes, gpu_label, nccl_socket_ifname, "
            "allow_cpu_on_accelerator_hosts, host_network, node_pool, exclusive_topology, max_restarts, "
            "service_account, container, command, coordinator_port, stop_rules");
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.qeue=x"}); }),
            "r.yaml: key 'cluster.qeue': unknown key (allowed under 'cluster': " + top + ")");
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.extra={a: 1}"}); }),
            "r.yaml: key 'cluster.extra': unknown key (allowed under 'cluster': " + top + ")");
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.stop_rules.nan_los=false"}); }),
            "r.yaml: key 'cluster.stop_rules.nan_los': unknown key (allowed under 'cluster.stop_rules': "
            "nan_loss, max_required_rbf, stall_minutes)");
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.stop_rules=5"}); }),
            "r.yaml: key 'cluster.stop_rules': expected a map (nan_loss, max_required_rbf, stall_minutes)");
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.stop_rules=null"}); }), "");
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.image={name: x}"}); }),
            "r.yaml: key 'cluster.image': expected a single value, not a map");
  // The same from the file, not an override.
  const std::string typo = std::string(kBase) + "  contianer: trainer\n";
  EXPECT_EQ(error_of([&] { parse_recipe(typo, "r.yaml", {}); }),
            "r.yaml: key 'cluster.contianer': unknown key (allowed under 'cluster': " + top + ")");
}

// A value of the wrong type names the key and what it expects, for every typed key of the table.
TEST(K8sRecipeKeys, WrongTypedValueNamesTheKey) {
  const std::map<KeyType, std::pair<std::string, std::string>> bad = {
      {KeyType::Int, {"many", "expected an integer, got 'many'"}},
      {KeyType::Float, {"fast", "expected a finite number, got 'fast'"}},
      {KeyType::Bool, {"maybe", "expected true or false, got 'maybe'"}},
      {KeyType::List, {"olmosft", "expected a non-empty list of strings"}},
  };
  int checked = 0;
  for (const ClusterKey& k : cluster_keys()) {
    auto it = bad.find(k.type);
    if (it == bad.end()) continue;
    std::vector<std::string> ov = {k.name + "=" + it->second.first};
    if (k.name == "cluster.nodes") ov.insert(ov.begin(), {"cluster.slice=", "cluster.accelerator=nvidia-l4"});
    const std::string e = error_of([&] { parse_recipe(kBase, "r.yaml", ov); });
    EXPECT_EQ(e, "r.yaml: key '" + k.name + "': " + it->second.second) << k.name;
    ++checked;
  }
  EXPECT_EQ(checked, 9);  // nodes, max_restarts, coordinator_port; 2 stop rules; 3 flags; command
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.command=[olmosft, [train]]"}); }),
            "r.yaml: key 'cluster.command': expected a list of strings, got an item that is not a string");
  EXPECT_EQ(error_of([] { parse_recipe(kBase, "r.yaml", {"cluster.coordinator_port=70000"}); }),
            "r.yaml: key 'cluster.coordinator_port': 70000 is out of range [1, 65535]");
  // A required key left out.
  std::string base = kBase;
  base.erase(base.find("  queue: post-training\n"), std::string("  queue: post-training\n").size());
  EXPECT_EQ(error_of([&] { parse_recipe(base, "r.yaml", {}); }),
            "r.yaml: key 'cluster.queue': missing (required)");
}

// `olmosft recipe keys` lists every cluster key after the trainer's: name, default, type and doc.
TEST(K8sRecipeKeys, RecipeKeysVerbListsEveryClusterKey) {
  std::string out;
  FILE* p = ::popen((std::string(OLMOSFT_BINARY) + " recipe keys 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << rc << "\n" << out;
  std::set<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.insert(line);
  for (const ClusterKey& k : cluster_keys()) {
    std::ostringstream want;
    olmosft::print_recipe_key(want, k);
    std::string line = want.str();
    line.pop_back();  // the newline
    EXPECT_TRUE(lines.count(line)) << "missing: " << line << "\n" << out;
    EXPECT_EQ(line.rfind(k.name + " = ", 0), 0u) << line;
    EXPECT_NE(line.find(std::string("  # ") + olmosft::key_type_name(k.type) + ": " + k.doc),
              std::string::npos)
        << line;
  }
  EXPECT_TRUE(lines.count("cluster.max_restarts = 3  # int: JobSet failurePolicy.maxRestarts")) << out;
  EXPECT_TRUE(
      lines.count("cluster.queue = (required)  # string: Kueue LocalQueue (label "
                  "kueue.x-k8s.io/queue-name)"))
      << out;
  EXPECT_NE(out.find("\nexport.hf = true  # bool: "), std::string::npos) << out;  // the trainer's keys too
}

// docs/k8s.md's key table lists exactly the table's cluster keys.
TEST(K8sRecipeKeys, DocsTableListsEveryClusterKey) {
  std::ifstream f(std::string(OLMOSFT_SOURCE_DIR) + "/docs/k8s.md");
  ASSERT_TRUE(f);
  std::set<std::string> documented;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("| `cluster.", 0) != 0) continue;
    documented.insert(line.substr(3, line.find('`', 3) - 3));
  }
  std::set<std::string> names;
  for (const ClusterKey& k : cluster_keys()) names.insert(k.name);
  EXPECT_EQ(documented, names);
}
