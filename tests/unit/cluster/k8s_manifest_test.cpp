// Rendered manifests of the runbook's 4x4x8 recipe: structure checked field by field after a YAML round
// trip, then `kubectl apply --dry-run=client --validate=false -f DIR`. kubectl needs API discovery even
// for a client dry run, so it is pointed at the loopback fake API (k8s_fake_api.h), which answers only
// discovery and "not found" for the objects; nothing is created anywhere.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "cluster/manifest.h"
#include "cluster/recipe.h"
#include "core/error.h"
#include "k8s_fake_api.h"

using namespace olmosft::cluster;
namespace fs = std::filesystem;

namespace {

const std::string kRecipe = std::string(OLMOSFT_SOURCE_DIR) + "/recipes/olmo35-small-sft.k8s.yaml";
const std::string kGpuRecipe = std::string(OLMOSFT_SOURCE_DIR) + "/recipes/olmo35-small-sft.gpu.k8s.yaml";

fs::path scratch(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("olmosft-k8s-manifest-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string find_kubectl() {
  if (const char* k = std::getenv("OLMOSFT_KUBECTL"); k && *k) return k;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= p.size()) {
    size_t c = p.find(':', pos);
    std::string dir = p.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    if (!dir.empty() && ::access((dir + "/kubectl").c_str(), X_OK) == 0) return dir + "/kubectl";
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return "";
}

std::string run(const std::string& cmd, int& rc) {
  std::string out;
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!f) {
    rc = -1;
    return "";
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  rc = ::pclose(f);
  return out;
}

}  // namespace

TEST(K8sManifest, RunbookRecipeMatchesSettings) {
  Recipe r = load_recipe(kRecipe, {});
  Rendered out = render(r, {"abc123"});
  fs::path dir = scratch("struct");
  write_rendered(out, dir.string());

  // Round trip through the YAML files that kubectl would read.
  std::vector<YAML::Node> docs;
  for (const char* f : {"0-configmap-recipe.yaml", "1-configmap-env.yaml", "2-jobset.yaml"})
    docs.push_back(YAML::LoadFile((dir / f).string()));
  const YAML::Node& js = docs[2];
  EXPECT_EQ(js["apiVersion"].as<std::string>(), "jobset.x-k8s.io/v1alpha2");
  EXPECT_EQ(js["kind"].as<std::string>(), "JobSet");
  EXPECT_EQ(js["metadata"]["name"].as<std::string>(), "olmo35-sft-h045-tpu-abc123");
  EXPECT_EQ(js["metadata"]["namespace"].as<std::string>(), "olmo");
  EXPECT_EQ(js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"].as<std::string>(), "post-training");
  EXPECT_EQ(js["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"].as<std::string>(),
            "cloud.google.com/gke-nodepool");
  // device=xla over the whole slice's mesh, which this build cannot run across hosts: the JobSet says so.
  EXPECT_EQ(
      js["metadata"]["annotations"]["olmosft.io/warning"].as<std::string>().rfind(
          "WARNING: device=xla on the 128 TPU chips of tpu-v4-4x4x8 (32 pods): the mesh (data=1 fsdp=16 "
          "expert=8 context=1) is one SPMD program over 128 TPU chips on 32 hosts",
          0),
      0u);
  EXPECT_EQ(js["spec"]["failurePolicy"]["maxRestarts"].as<int>(), 3);
  EXPECT_EQ(js["spec"]["network"]["subdomain"].as<std::string>(), "olmo35-sft-h045-tpu-abc123");
  EXPECT_TRUE(js["spec"]["network"]["enableDNSHostnames"].as<bool>());
  ASSERT_EQ(js["spec"]["replicatedJobs"].size(), 1u);
  const YAML::Node rj = js["spec"]["replicatedJobs"][0];
  EXPECT_EQ(rj["name"].as<std::string>(), "slice");
  EXPECT_EQ(rj["replicas"].as<int>(), 1);
  const YAML::Node job = rj["template"]["spec"];
  EXPECT_EQ(job["parallelism"].as<int>(), 32);  // 4x4x8 = 128 chips / 4 per host
  EXPECT_EQ(job["completions"].as<int>(), 32);
  EXPECT_EQ(job["completionMode"].as<std::string>(), "Indexed");
  EXPECT_EQ(job["backoffLimit"].as<int>(), 0);
  const YAML::Node pod = job["template"]["spec"];
  EXPECT_EQ(pod["restartPolicy"].as<std::string>(), "Never");
  EXPECT_TRUE(pod["hostNetwork"].as<bool>());
  EXPECT_EQ(pod["dnsPolicy"].as<std::string>(), "ClusterFirstWithHostNet");
  EXPECT_EQ(pod["terminationGracePeriodSeconds"].as<int>(), 900);  // checkpoint.grace_seconds
  EXPECT_EQ(pod["serviceAccountName"].as<std::string>(), "olmo");
  EXPECT_EQ(pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"].as<std::string>(), "tpu-v4-podslice");
  EXPECT_EQ(pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"].as<std::string>(), "4x4x8");
  const YAML::Node c = pod["containers"][0];
  EXPECT_EQ(c["resources"]["limits"]["google.com/tpu"].as<std::string>(), "4");
  EXPECT_EQ(c["resources"]["limits"]["google.com/tpu"].Tag(), "!");  // quoted: a Quantity string
  EXPECT_EQ(c["volumeMounts"][0]["mountPath"].as<std::string>(), "/etc/olmosft");
  std::set<std::string> env_names;
  for (const auto& e : c["env"]) env_names.insert(e["name"].as<std::string>());
  for (const char* n : {"JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_INDEX", "RESTART_ATTEMPT"})
    EXPECT_TRUE(env_names.count(n)) << n;
  // libtpu's multi-host environment: this pod's worker id (its completion index), every pod's host name
  // through the headless service, in worker order.
  std::map<std::string, std::string> fields;
  for (const auto& e : c["env"])
    if (e["valueFrom"])
      fields[e["name"].as<std::string>()] = e["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>();
  EXPECT_EQ(fields["TPU_WORKER_ID"], "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  const std::string hosts = docs[1]["data"]["TPU_WORKER_HOSTNAMES"].as<std::string>();
  EXPECT_EQ(hosts.substr(0, hosts.find(',')),
            "olmo35-sft-h045-tpu-abc123-slice-0-0.olmo35-sft-h045-tpu-abc123");
  EXPECT_EQ(std::count(hosts.begin(), hosts.end(), ','), 31);
  EXPECT_TRUE(hosts.ends_with(",olmo35-sft-h045-tpu-abc123-slice-0-31.olmo35-sft-h045-tpu-abc123")) << hosts;
  EXPECT_EQ(docs[1]["data"]["OLMOSFT_DEVICE"].as<std::string>(), "xla");

  // The recipe ConfigMap holds the effective recipe, which parses back to the same settings.
  EXPECT_EQ(docs[0]["kind"].as<std::string>(), "ConfigMap");
  EXPECT_EQ(docs[0]["metadata"]["name"].as<std::string>(), "olmo35-sft-h045-tpu-abc123-recipe");
  Recipe back = parse_recipe(docs[0]["data"]["recipe.yaml"].as<std::string>(), "cm", {});
  EXPECT_EQ(back.cluster.slice.hosts, 32);
  EXPECT_EQ(back.train.batch.slots, 16);
  EXPECT_DOUBLE_EQ(*back.cluster.stop_rules.max_required_rbf, 2.5);
  EXPECT_DOUBLE_EQ(*back.cluster.stop_rules.stall_minutes, 30);
  std::ifstream src(kRecipe);
  std::string src_text((std::istreambuf_iterator<char>(src)), {});
  EXPECT_EQ(docs[0]["data"]["source.yaml"].as<std::string>(), src_text);
  // The env ConfigMap: every value a string (quoted numbers).
  const YAML::Node env = docs[1]["data"];
  EXPECT_EQ(env["OLMOSFT_NUM_PODS"].as<std::string>(), "32");
  EXPECT_EQ(env["OLMOSFT_NUM_PODS"].Tag(), "!");
  EXPECT_EQ(env["OLMOSFT_SUBDOMAIN"].as<std::string>(), "olmo35-sft-h045-tpu-abc123");

  // manifest.json reads back identically (what `k8s launch DIR` uses).
  Rendered again = read_rendered(dir.string());
  ASSERT_EQ(again.objects.size(), out.objects.size());
  for (size_t i = 0; i < out.objects.size(); ++i) EXPECT_EQ(again.objects[i].second, out.objects[i].second);
  fs::remove_all(dir);
}

TEST(K8sManifest, GpuSliceAndRefusal) {
  Recipe r = load_recipe(kRecipe, {"cluster.slice=gpu-h200-2x8", "per_device_batch=1", "global_batch=16",
                                   "mesh={fsdp: 16}", "cluster.host_network=false", "xla.plugin=cuda"});
  Rendered out = render(r, {"7"});
  const auto& pod =
      out.objects.back().second["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
  EXPECT_EQ(pod["nodeSelector"]["cloud.google.com/gke-accelerator"], "nvidia-h200-141gb");
  EXPECT_EQ(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8");
  EXPECT_EQ(pod["tolerations"][0]["key"], "nvidia.com/gpu");
  EXPECT_FALSE(pod.contains("hostNetwork"));
  EXPECT_EQ(out.objects.back().second["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"], 2);
  // Refused before anything is rendered: a row spread over 16 GPUs (1/16 per device) on an 8-GPU node.
  try {
    load_recipe(kRecipe, {"cluster.slice=gpu-h200-1x8", "per_device_batch=0.0625", "mesh={fsdp: 8}"});
    FAIL() << "expected a refusal";
  } catch (const olmosft::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "per_device_batch 0.0625 puts one row on 16 devices, which does not divide 8"),
              std::string::npos)
        << e.what();
  }
}

// Issue #15: the shipped GPU recipe, rendered and read back from YAML, field by field.
TEST(K8sManifest, GpuRecipeMatchesSettings) {
  Recipe r = load_recipe(kGpuRecipe, {});
  Rendered out = render(r, {"g1"});
  fs::path dir = scratch("gpu");
  write_rendered(out, dir.string());
  std::vector<YAML::Node> docs;
  for (const char* f : {"0-configmap-recipe.yaml", "1-configmap-env.yaml", "2-jobset.yaml"})
    docs.push_back(YAML::LoadFile((dir / f).string()));
  const YAML::Node& js = docs[2];
  const std::string name = "olmo35-sft-h045-h100-g1";
  EXPECT_EQ(js["metadata"]["name"].as<std::string>(), name);
  EXPECT_EQ(js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"].as<std::string>(), "post-training");
  EXPECT_FALSE(js["metadata"]["annotations"]["alpha.jobset.sigs.k8s.io/exclusive-topology"]);  // GPU: none
  EXPECT_EQ(
      js["metadata"]["annotations"]["olmosft.io/warning"].as<std::string>().rfind(
          "WARNING: device=xla on the 16 GPUs of gpu-h100-2x8 (2 pods): the mesh (data=1 fsdp=2 expert=8 "
          "context=1) is one SPMD program over 16 GPUs on 2 hosts",
          0),
      0u);
  EXPECT_EQ(js["spec"]["failurePolicy"]["restartStrategy"].as<std::string>(), "BlockingRecreate");
  EXPECT_EQ(js["spec"]["successPolicy"]["targetReplicatedJobs"][0].as<std::string>(), "node");
  EXPECT_EQ(js["spec"]["network"]["subdomain"].as<std::string>(), name);
  EXPECT_TRUE(js["spec"]["network"]["enableDNSHostnames"].as<bool>());
  EXPECT_TRUE(js["spec"]["network"]["publishNotReadyAddresses"].as<bool>());
  ASSERT_EQ(js["spec"]["replicatedJobs"].size(), 1u);
  const YAML::Node rj = js["spec"]["replicatedJobs"][0];
  EXPECT_EQ(rj["name"].as<std::string>(), "node");
  EXPECT_EQ(rj["replicas"].as<int>(), 1);
  const YAML::Node job = rj["template"]["spec"];
  EXPECT_EQ(job["parallelism"].as<int>(), 2);  // one pod per node
  EXPECT_EQ(job["completions"].as<int>(), 2);
  EXPECT_EQ(job["completionMode"].as<std::string>(), "Indexed");
  EXPECT_EQ(job["backoffLimit"].as<int>(), 0);
  const YAML::Node pod = job["template"]["spec"];
  EXPECT_EQ(job["template"]["metadata"]["labels"]["olmosft.io/run"].as<std::string>(), name);
  EXPECT_FALSE(pod["hostNetwork"]);
  EXPECT_FALSE(pod["dnsPolicy"]);
  EXPECT_EQ(pod["terminationGracePeriodSeconds"].as<int>(), 900);
  ASSERT_EQ(pod["nodeSelector"].size(), 1u);
  EXPECT_EQ(pod["nodeSelector"]["cloud.google.com/gke-accelerator"].as<std::string>(), "nvidia-h100-80gb");
  ASSERT_EQ(pod["tolerations"].size(), 1u);
  EXPECT_EQ(pod["tolerations"][0]["key"].as<std::string>(), "nvidia.com/gpu");
  EXPECT_EQ(pod["tolerations"][0]["operator"].as<std::string>(), "Exists");
  EXPECT_EQ(pod["tolerations"][0]["effect"].as<std::string>(), "NoSchedule");
  // One pod per node: a required anti-affinity on the run's own pod label, per hostname.
  const YAML::Node anti =
      pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(anti.size(), 1u);
  EXPECT_EQ(anti[0]["topologyKey"].as<std::string>(), "kubernetes.io/hostname");
  EXPECT_EQ(anti[0]["labelSelector"]["matchLabels"]["olmosft.io/run"].as<std::string>(), name);
  const YAML::Node c = pod["containers"][0];
  EXPECT_EQ(c["image"].as<std::string>(), "us-docker.pkg.dev/ai2-olmo/olmo/olmosft:latest");
  EXPECT_EQ(c["command"][0].as<std::string>(), "olmosft");
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<std::string>(), "8");
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].Tag(), "!");  // quoted: a Quantity string
  EXPECT_EQ(c["resources"]["requests"]["nvidia.com/gpu"].as<std::string>(), "8");
  EXPECT_FALSE(c["resources"]["limits"]["google.com/tpu"]);
  ASSERT_EQ(c["volumeMounts"].size(), 2u);
  EXPECT_EQ(c["volumeMounts"][1]["name"].as<std::string>(), "dshm");
  EXPECT_EQ(c["volumeMounts"][1]["mountPath"].as<std::string>(), "/dev/shm");
  ASSERT_EQ(pod["volumes"].size(), 2u);
  EXPECT_EQ(pod["volumes"][1]["name"].as<std::string>(), "dshm");
  EXPECT_EQ(pod["volumes"][1]["emptyDir"]["medium"].as<std::string>(), "Memory");
  std::map<std::string, std::string> field_env;
  for (const auto& e : c["env"])
    field_env[e["name"].as<std::string>()] = e["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>();
  EXPECT_EQ(field_env["OLMOSFT_NODE_RANK"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  // The rendezvous and NCCL environment: pod 0's DNS name through the JobSet's headless service.
  const YAML::Node env = docs[1]["data"];
  const std::string pod0 = name + "-node-0-0." + name + ":29500";
  EXPECT_EQ(out.coordinator, pod0);
  EXPECT_EQ(env["OLMOSFT_COORDINATOR"].as<std::string>(), pod0);
  EXPECT_EQ(env["NCCL_COMM_ID"].as<std::string>(), pod0);
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"].as<std::string>(), "eth0");
  EXPECT_EQ(env["NCCL_NVLS_ENABLE"].as<std::string>(), "0");
  EXPECT_EQ(env["NCCL_NVLS_ENABLE"].Tag(), "!");
  EXPECT_EQ(env["NCCL_DEBUG"].as<std::string>(), "WARN");
  EXPECT_EQ(env["OLMOSFT_DEVICE"].as<std::string>(), "xla");
  EXPECT_EQ(env["OLMOSFT_WORLD_SIZE"].as<std::string>(), "16");
  EXPECT_EQ(env["OLMOSFT_LOCAL_WORLD_SIZE"].as<std::string>(), "8");
  EXPECT_EQ(env["OLMOSFT_NUM_PODS"].as<std::string>(), "2");
  EXPECT_EQ(env["OLMOSFT_DEVICES_PER_POD"].as<std::string>(), "8");
  // The mounted recipe parses back: 16 devices at 0.125 rows each (2 rows a micro-step, accumulation 8),
  // device=xla on the CUDA plugin over the mesh fsdp 2 x expert 8.
  Recipe back = parse_recipe(docs[0]["data"]["recipe.yaml"].as<std::string>(), "cm", {});
  EXPECT_EQ(back.train.batch.devices, 16);
  EXPECT_EQ(back.train.batch.grad_accum, 8);
  EXPECT_EQ(back.train.device, "xla");
  EXPECT_EQ(back.train.xla.plugin, "cuda");
  EXPECT_EQ(xla_mesh(back.train).text(), "data=1 fsdp=2 expert=8 context=1");
  EXPECT_EQ(back.cluster.slice.text, "gpu-h100-2x8");
  // gpu_label=nvidia: NVIDIA GPU Feature Discovery's product label instead of GKE's.
  Rendered gfd = render(load_recipe(kGpuRecipe, {"cluster.gpu_label=nvidia"}), {"g2"});
  const auto& sel =
      gfd.objects.back()
          .second["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"];
  EXPECT_EQ(sel, (OJson{{"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"}}));
  // A TPU render has none of the GPU parts.
  const Rendered tpu = render(load_recipe(kRecipe, {}), {"t1"});
  const OJson& tpu_pod =
      tpu.objects.back().second["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"];
  EXPECT_FALSE(tpu_pod.contains("affinity"));
  EXPECT_FALSE(tpu_pod.contains("tolerations"));
  EXPECT_EQ(tpu_pod["volumes"].size(), 1u);
  fs::remove_all(dir);
}

TEST(K8sManifest, CliRenderRefusesBeforeWriting) {
  fs::path dir = scratch("cli");
  int rc = 0;
  std::string out = run(std::string(OLMOSFT_BINARY) + " k8s render " + kRecipe + " global_batch=20 --out " +
                            (dir / "m").string(),
                        rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("global_batch=20 is not divisible"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "m"));
  out = run(
      std::string(OLMOSFT_BINARY) + " k8s render " + kRecipe + " --suffix s1 --out " + (dir / "m").string(),
      rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("32 pods x 4 chips = 128 devices"), std::string::npos) << out;
  EXPECT_NE(out.find("\nWARNING: device=xla on the 128 TPU chips of tpu-v4-4x4x8 (32 pods): the mesh"),
            std::string::npos)
      << out;
  EXPECT_TRUE(fs::exists(dir / "m" / "2-jobset.yaml"));
  // Issue #17: a second render into the same --out is refused (manifests of two renders must not mix), and
  // so is a recipe the pods' `olmosft train` would refuse (no data.path), before anything is written.
  out = run(
      std::string(OLMOSFT_BINARY) + " k8s render " + kRecipe + " --suffix s2 --out " + (dir / "m").string(),
      rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("is not empty: choose a new directory"), std::string::npos) << out;
  out = run(
      std::string(OLMOSFT_BINARY) + " k8s render " + kRecipe + " data.path= --out " + (dir / "n").string(),
      rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("data.path is required"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "n"));
  // Issue #15: device=cpu on a TPU slice without cluster.allow_cpu_on_accelerator_hosts is refused, nothing
  // written.
  out = run(
      std::string(OLMOSFT_BINARY) + " k8s render " + kRecipe + " device=cpu --out " + (dir / "t").string(),
      rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("device=cpu would train on the hosts' CPUs and leave the accelerators idle. Set "
                     "device: xla with xla.plugin: tpu to train on them"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir / "t"));
  // The GPU recipe renders (device=xla over a 2-host mesh) and says plainly what this build's pods would do;
  // so does device=cuda.
  out = run(
      std::string(OLMOSFT_BINARY) + " k8s render " + kGpuRecipe + " --suffix g --out " + (dir / "g").string(),
      rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("2 pods x 8 GPUs = 16 devices (nvidia-h100-80gb, 80 GB each, "
                     "cloud.google.com/gke-accelerator=nvidia-h100-80gb)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("\nWARNING: device=xla on the 16 GPUs of gpu-h100-2x8 (2 pods): the mesh (data=1 fsdp=2 "
                     "expert=8 context=1) is one SPMD program over 16 GPUs on 2 hosts, and this build runs a "
                     "mesh inside one process only"),
            std::string::npos)
      << out;
  const std::string cuda = run(std::string(OLMOSFT_BINARY) + " k8s render " + kGpuRecipe +
                                   " device=cuda --suffix c --out " + (dir / "c").string(),
                               rc);
  EXPECT_EQ(rc, 0) << cuda;
  EXPECT_NE(
      cuda.find("\nWARNING: device=cuda: olmosft has no hand-written CUDA backend (GPUs train with device: "
                "xla and xla.plugin: cuda)"),
      std::string::npos)
      << cuda;
  EXPECT_TRUE(fs::exists(dir / "g" / "2-jobset.yaml"));
  fs::remove_all(dir);
}

TEST(K8sManifest, KubectlClientDryRun) {
  const std::string kubectl = find_kubectl();
  if (kubectl.empty()) {
    GTEST_SKIP()
        << "skipped: kubectl not found on PATH (set OLMOSFT_KUBECTL or apt-get install kubernetes-client)";
  }
  Recipe r = load_recipe(kRecipe, {});
  Rendered out = render(r, {"abc123"});
  fs::path dir = scratch("kubectl");
  write_rendered(out, (dir / "m").string());
  fs::remove(dir / "m" / "manifest.json");  // kubectl -f DIR reads every .json/.yaml file
  write_rendered(render(load_recipe(kGpuRecipe, {}), {"abc123"}), (dir / "g").string());  // issue #15
  fs::remove(dir / "g" / "manifest.json");

  std::mutex mu;
  std::vector<std::string> seen;
  auto resources = [](const std::string& gv, const std::string& name, const std::string& kind) {
    return R"({"kind":"APIResourceList","apiVersion":"v1","groupVersion":")" + gv +
           R"(","resources":[{"name":")" + name + R"(","singularName":"","namespaced":true,"kind":")" + kind +
           R"(","verbs":["create","delete","get","list","patch","update","watch"]}]})";
  };
  fakeapi::Server srv(
      [&](const fakeapi::Request& rq) {
        {
          std::lock_guard<std::mutex> g(mu);
          seen.push_back(rq.method + " " + rq.path);
        }
        if (rq.method != "GET")
          return fakeapi::Response{405, fakeapi::status_body(405, "MethodNotAllowed", "fake")};
        if (rq.path == "/api")
          return fakeapi::Response{
              200, R"({"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]})"};
        if (rq.path == "/apis")
          return fakeapi::Response{
              200,
              R"({"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"jobset.x-k8s.io","versions":[)"
              R"({"groupVersion":"jobset.x-k8s.io/v1alpha2","version":"v1alpha2"}],"preferredVersion":)"
              R"({"groupVersion":"jobset.x-k8s.io/v1alpha2","version":"v1alpha2"}}]})"};
        if (rq.path == "/api/v1") return fakeapi::Response{200, resources("v1", "configmaps", "ConfigMap")};
        if (rq.path == "/apis/jobset.x-k8s.io/v1alpha2")
          return fakeapi::Response{200, resources("jobset.x-k8s.io/v1alpha2", "jobsets", "JobSet")};
        return fakeapi::Response{404, fakeapi::status_body(404, "NotFound", "not found")};
      },
      60);
  fs::path kc = dir / "kubeconfig";
  std::ofstream(kc)
      << "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n"
      << "    server: " << srv.url() << "\ncontexts:\n- name: fake\n  context: {cluster: fake, user: u}\n"
      << "users:\n- name: u\n  user: {token: fake}\n";
  int rc = 0;
  std::string cmd = "HOME=" + dir.string() + " " + kubectl + " --kubeconfig " + kc.string() +
                    " --cache-dir " + (dir / "cache").string() +
                    " apply --dry-run=client --validate=false -f " + (dir / "m").string() + " -f " +
                    (dir / "g").string();
  std::string text = run(cmd, rc);
  srv.stop();
  std::fprintf(stderr, "%s\n%s", cmd.c_str(), text.c_str());
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("configmap/olmo35-sft-h045-tpu-abc123-recipe created (dry run)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("configmap/olmo35-sft-h045-tpu-abc123-env created (dry run)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("jobset.jobset.x-k8s.io/olmo35-sft-h045-tpu-abc123 created (dry run)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("jobset.jobset.x-k8s.io/olmo35-sft-h045-h100-abc123 created (dry run)"),
            std::string::npos)
      << text;
  for (const auto& s : seen) EXPECT_EQ(s.rfind("GET ", 0), 0u) << "kubectl changed something: " << s;
  fs::remove_all(dir);
}
