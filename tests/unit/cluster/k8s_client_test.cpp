// The REST client, launch/status/stop/watch against a stateful fake API server on 127.0.0.1 (k8s_fake_api.h):
// JobSet + Kueue Workload + pods with scripted logs, a log stream that drops mid-chunk, a pod watch that
// answers 410 (ERROR event inside a 200 stream), and Kueue's reaction to spec.active=false (evict, suspend
// the JobSet, delete the pods). Also: the error messages for a bad kubeconfig, 401, 403 and missing CRDs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "cluster/k8s_ops.h"
#include "cluster/kube_client.h"
#include "cluster/manifest.h"
#include "cluster/recipe.h"
#include "cluster/timeutil.h"
#include "k8s_fake_api.h"
#include "train/log_lines.h"

using namespace olmosft::cluster;
using json = nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kRecipe = std::string(OLMOSFT_SOURCE_DIR) + "/recipes/olmo35-small-sft.k8s.yaml";
// A 4-host slice (tpu-v4-2x2x4 = 16 chips) keeps the fake small; 16 x 0.125 = 2 rows per step.
const std::vector<std::string> kSmall = {"cluster.slice=tpu-v4-2x2x4", "mesh={fsdp: 16}", "global_batch=2"};

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("olmosft-k8s-client-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

fakeapi::Response js(int code, const json& j) { return fakeapi::Response{code, j.dump()}; }
fakeapi::Response status(int code, const std::string& reason, const std::string& msg) {
  return fakeapi::Response{code, fakeapi::status_body(code, reason, msg)};
}

// ------------------------------------------------------------------ the fake cluster
struct FakeCluster {
  // scenario
  std::string token = "good";
  int steps = 40;
  int loss_pod = 2;          // the pod that logs LOSS-PARTS (not pod 0, as on the real slice)
  int drip_ms = 4;           // a new step every 4 ms of real time
  int drop_after_lines = 9;  // the loss pod's first log connection breaks after this many lines (0: never)
  int nan_at = 0;            // ce=nan from this step on
  int rbf_high_at = 0;       // REQUIRED_RBF value=2.7 from this step on (1.9 before)
  std::vector<std::string> script;  // non-empty: the loss pod logs these lines, one per step (a real log)
  int stall_after = 0;              // every pod stops logging after this step (and keeps running)
  bool waiting_first = false;  // each pod's first log request: 400 "waiting to start" (container creating)
  std::set<int> answered_400;
  bool watch_410 = true;  // 1st pod watch: ERROR event with a 410 Status in a 200 stream; 2nd: HTTP 410

  // state
  std::mutex mu;
  std::map<std::string, json> configmaps;
  json jobset;  // null until created
  json workload;
  bool active = true;
  Clock::time_point t0, deactivated_at;
  bool deactivated = false;
  int hosts = 0;
  int64_t base_ns = 1764633600LL * 1000000000LL;  // 2025-12-02T00:00:00Z (log timestamps)
  // counters
  int workload_patches = 0, jobset_patches = 0, pod_lists = 0, pod_watches = 0, log_requests = 0;
  std::vector<std::string> since_times;
  std::vector<std::string> bad_content_types;

  std::string pod_name(int i) const {
    return jobset["metadata"]["name"].get<std::string>() + "-slice-0-" + std::to_string(i) + "-x7k2p";
  }

  int last_step() const { return stall_after ? std::min(stall_after, steps) : steps; }
  // Steps produced so far (time-based).
  int produced(Clock::time_point now) const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - t0).count();
    return static_cast<int>(std::min<int64_t>(last_step(), ms / drip_ms));
  }
  bool pods_deleted(Clock::time_point now) const {
    return deactivated && now - deactivated_at > std::chrono::milliseconds(50);
  }
  bool finished(Clock::time_point now) const { return !stall_after && produced(now) >= steps; }
  std::string phase(Clock::time_point now) const { return finished(now) ? "Succeeded" : "Running"; }

  // Log lines of pod i up to step n (timestamp ns, text).
  std::vector<std::pair<int64_t, std::string>> lines(int i, int n) const {
    std::vector<std::pair<int64_t, std::string>> out;
    out.emplace_back(base_ns, "starting olmosft train (pod " + std::to_string(i) + ")");
    for (int s = 1; s <= n; ++s) {
      int64_t ts = base_ns + s * 250000000LL;  // 4 steps per second: sinceTime (whole seconds) overlaps
      char buf[256];
      if (i == loss_pod && !script.empty()) {
        if (static_cast<size_t>(s) <= script.size()) out.emplace_back(ts, script[static_cast<size_t>(s - 1)]);
      } else if (i == loss_pod) {
        bool nan = nan_at && s >= nan_at;
        out.emplace_back(
            ts, olmosft::train::format_loss_parts(
                    {s, {nan ? std::nan("") : 2.0 - s * 0.01, 0.000123, 0.010012, 0.000045}, 812345}));
        out.emplace_back(
            ts + 1000, olmosft::train::format_required_rbf({s, rbf_high_at && s >= rbf_high_at ? 2.7 : 1.9}));
      } else {
        std::snprintf(buf, sizeof buf, "completed step: %d, loss: %.3f", s, 1.5 + 0.01 * i);
        out.emplace_back(ts, buf);
      }
    }
    return out;
  }

  json pod_json(int i, Clock::time_point now) const {
    const std::string ph = phase(now);
    json state =
        ph == "Running" ? json{{"running", json::object()}} : json{{"terminated", {{"exitCode", 0}}}};
    return {{"metadata",
             {{"name", pod_name(i)},
              {"namespace", "olmo"},
              {"resourceVersion", "100"},
              {"labels",
               {{"jobset.sigs.k8s.io/jobset-name", jobset["metadata"]["name"]},
                {"jobset.sigs.k8s.io/restart-attempt", "0"},
                {"batch.kubernetes.io/job-completion-index", std::to_string(i)}}}}},
            {"status",
             {{"phase", ph}, {"containerStatuses", json::array({{{"name", "trainer"}, {"state", state}}})}}}};
  }

  void deactivate() {
    active = false;
    deactivated = true;
    deactivated_at = Clock::now();
    workload["spec"]["active"] = false;
    workload["status"]["conditions"] =
        json::array({{{"type", "QuotaReserved"}, {"status", "False"}, {"reason", "Pending"}},
                     {{"type", "Admitted"}, {"status", "False"}, {"reason", "NoReservation"}},
                     {{"type", "Evicted"},
                      {"status", "True"},
                      {"reason", "Deactivated"},
                      {"message", "The workload is deactivated"}}});
    jobset["spec"]["suspend"] = true;
    jobset["status"]["conditions"] =
        json::array({{{"type", "Suspended"}, {"status", "True"}, {"reason", "SuspendedJobs"}}});
  }

  fakeapi::Response handle(const fakeapi::Request& rq) {
    auto it = rq.headers.find("authorization");
    if (it == rq.headers.end() || it->second != "Bearer " + token)
      return status(401, "Unauthorized", "Unauthorized");
    std::unique_lock<std::mutex> g(mu);
    const auto now = Clock::now();
    const std::string& p = rq.path;
    const std::string nsp = "/api/v1/namespaces/olmo";
    const std::string jsp = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/olmo/jobsets";
    const std::string wlp = "/apis/kueue.x-k8s.io/v1beta2/namespaces/olmo/workloads";
    if (rq.method == "PATCH" && (!rq.headers.count("content-type") ||
                                 rq.headers.at("content-type") != "application/merge-patch+json"))
      bad_content_types.push_back(rq.headers.count("content-type") ? rq.headers.at("content-type") : "none");
    // discovery
    if (p == "/apis/jobset.x-k8s.io/v1alpha2")
      return js(200, {{"kind", "APIResourceList"}, {"resources", json::array()}});
    if (p == "/apis/kueue.x-k8s.io")
      return js(
          200,
          {{"kind", "APIGroup"}, {"name", "kueue.x-k8s.io"}, {"preferredVersion", {{"version", "v1beta2"}}}});
    if (p == "/apis/kueue.x-k8s.io/v1beta2/namespaces/olmo/localqueues/post-training")
      return js(200, {{"kind", "LocalQueue"}});
    // configmaps
    if (rq.method == "POST" && p == nsp + "/configmaps") {
      json cm = json::parse(rq.body);
      configmaps[cm["metadata"]["name"]] = cm;
      return js(201, cm);
    }
    if (p.rfind(nsp + "/configmaps/", 0) == 0) {
      std::string name = p.substr(nsp.size() + 12);
      if (!configmaps.count(name))
        return status(404, "NotFound", "configmaps \\\"" + name + "\\\" not found");
      if (rq.method == "PATCH") configmaps[name].merge_patch(json::parse(rq.body));
      return js(200, configmaps[name]);
    }
    // jobsets
    if (rq.method == "POST" && p == jsp) {
      if (!jobset.is_null()) return status(409, "AlreadyExists", "jobsets.jobset.x-k8s.io already exists");
      jobset = json::parse(rq.body);
      jobset["metadata"]["uid"] = "0f5e-uid-1234";
      jobset["spec"]["suspend"] = false;
      jobset["status"] = json::object();
      hosts = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"];
      workload = {
          {"metadata",
           {{"name", "jobset-" + jobset["metadata"]["name"].get<std::string>() + "-3c1a9"},
            {"labels", {{"kueue.x-k8s.io/job-uid", "0f5e-uid-1234"}}}}},
          {"spec", {{"active", true}, {"queueName", "post-training"}}},
          {"status",
           {{"conditions",
             json::array({{{"type", "QuotaReserved"}, {"status", "True"}, {"reason", "QuotaReserved"}},
                          {{"type", "Admitted"}, {"status", "True"}, {"reason", "Admitted"}}})}}}};
      t0 = now;
      return js(201, jobset);
    }
    if (!jobset.is_null() && p == jsp + "/" + jobset["metadata"]["name"].get<std::string>()) {
      if (rq.method == "PATCH") {
        ++jobset_patches;
        return js(200, jobset);
      }
      json out = jobset;
      if (finished(now) && !deactivated) out["status"]["terminalState"] = "Completed";
      return js(200, out);
    }
    if (p.rfind(jsp + "/", 0) == 0) return status(404, "NotFound", "jobsets.jobset.x-k8s.io not found");
    // workloads
    if (rq.method == "GET" && p == wlp) {
      json items = json::array();
      if (!jobset.is_null() && rq.param("labelSelector") ==
                                   "kueue.x-k8s.io/job-uid=" + jobset["metadata"]["uid"].get<std::string>())
        items.push_back(workload);
      return js(200, {{"kind", "WorkloadList"}, {"items", items}});
    }
    if (!workload.is_null() && p == wlp + "/" + workload["metadata"]["name"].get<std::string>()) {
      if (rq.method == "PATCH") {
        ++workload_patches;
        json patch = json::parse(rq.body);
        if (patch["spec"].contains("active") && patch["spec"]["active"] == false && active) deactivate();
      }
      return js(200, workload);
    }
    // pods
    if (rq.method == "GET" && p == nsp + "/pods") {
      if (jobset.is_null() || rq.param("labelSelector") != "jobset.sigs.k8s.io/jobset-name=" +
                                                               jobset["metadata"]["name"].get<std::string>())
        return js(200,
                  {{"kind", "PodList"}, {"metadata", {{"resourceVersion", "1"}}}, {"items", json::array()}});
      if (rq.param("watch") == "1") {
        ++pod_watches;
        if (watch_410 && pod_watches == 1) {
          fakeapi::Response r;
          r.stream = [](fakeapi::Stream& w) {
            json ev = {{"type", "ERROR"},
                       {"object", json::parse(fakeapi::status_body(410, "Expired",
                                                                   "too old resource version: 1 (5)"))}};
            w.chunk(ev.dump() + "\n");
          };
          return r;
        }
        // The re-watch after the relist: a plain HTTP 410 this time (the other way a server says "too old").
        if (watch_410 && pod_watches == 2)
          return status(410, "Expired", "too old resource version: 100 (120)");
        fakeapi::Response r;
        r.stream = [this](fakeapi::Stream& w) { stream_pod_events(w); };
        return r;
      }
      ++pod_lists;
      json items = json::array();
      if (!pods_deleted(now))
        for (int i = 0; i < hosts; ++i) items.push_back(pod_json(i, now));
      return js(200, {{"kind", "PodList"}, {"metadata", {{"resourceVersion", "100"}}}, {"items", items}});
    }
    if (rq.method == "GET" && p.rfind(nsp + "/pods/", 0) == 0 && p.size() > 4 &&
        p.substr(p.size() - 4) == "/log") {
      std::string name = p.substr(nsp.size() + 6, p.size() - 4 - nsp.size() - 6);
      int idx = -1;
      for (int i = 0; i < hosts; ++i)
        if (pod_name(i) == name) idx = i;
      if (idx < 0 || pods_deleted(now)) return status(404, "NotFound", "pods \\\"" + name + "\\\" not found");
      ++log_requests;
      if (waiting_first && !answered_400.count(idx)) {
        answered_400.insert(idx);
        return status(
            400, "BadRequest",
            "container \\\"trainer\\\" in pod \\\"" + name + "\\\" is waiting to start: ContainerCreating");
      }
      int64_t since = -1;
      if (!rq.param("sinceTime").empty()) {
        since_times.push_back(rq.param("sinceTime"));
        since = parse_rfc3339_ns(rq.param("sinceTime"));
      }
      const bool drop = idx == loss_pod && drop_after_lines > 0 && since < 0;
      fakeapi::Response r;
      r.content_type = "text/plain";
      r.stream = [this, idx, since, drop](fakeapi::Stream& w) { stream_log(w, idx, since, drop); };
      return r;
    }
    return status(404, "NotFound", "the server could not find the requested resource");
  }

  void stream_log(fakeapi::Stream& w, int idx, int64_t since, bool drop) {
    size_t sent = 0;
    int total_sent = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!w.stopping() && Clock::now() < deadline) {
      std::vector<std::pair<int64_t, std::string>> ls;
      bool done, gone;
      {
        std::lock_guard<std::mutex> g(mu);
        auto now = Clock::now();
        ls = lines(idx, produced(now));
        done = finished(now);
        gone = pods_deleted(now) || deactivated;
      }
      std::vector<std::string> fresh;
      size_t k = 0;
      for (const auto& [ts, text] : ls) {
        if (since >= 0 && ts < since) continue;
        if (k++ < sent) continue;
        fresh.push_back(format_rfc3339(ts, true) + " " + text + "\n");
      }
      for (const auto& l : fresh) {
        // Split every line across two chunks: the client must join lines across chunk boundaries.
        if (!w.chunk(l.substr(0, l.size() / 2)) || !w.chunk(l.substr(l.size() / 2))) return;
        ++sent;
        if (drop && ++total_sent == drop_after_lines) {
          w.chunk("2025-12-02T00:00:59.0Z LOSS-PARTS step=99");  // half a line, then the connection breaks
          w.drop();
          return;
        }
      }
      if (done || gone) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  void stream_pod_events(fakeapi::Stream& w) {
    std::map<int, std::string> last;
    const auto end = Clock::now() + std::chrono::seconds(2);  // like timeoutSeconds: the client re-watches
    int n = 0;
    while (!w.stopping() && Clock::now() < end) {
      std::vector<std::string> evs;
      {
        std::lock_guard<std::mutex> g(mu);
        auto now = Clock::now();
        for (int i = 0; i < hosts; ++i) {
          std::string ph = pods_deleted(now) ? "DELETED" : phase(now);
          if (last[i] == ph) continue;
          last[i] = ph;
          json ev = {{"type", ph == "DELETED" ? "DELETED" : "MODIFIED"}, {"object", pod_json(i, now)}};
          evs.push_back(ev.dump() + "\n");
        }
      }
      if (++n % 20 == 0)
        evs.push_back(R"({"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"101"}}})"
                      "\n");
      for (const auto& e : evs)
        if (!w.chunk(e)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
};

struct Env {
  FakeCluster cluster;
  fakeapi::Server server;
  fs::path dir;
  KubeClient client;
  Rendered rendered;
  explicit Env(const std::string& name, std::vector<std::string> overrides = {})
      : server([this](const fakeapi::Request& r) { return cluster.handle(r); }, 60),
        dir(scratch(name)),
        client(config()) {
    std::vector<std::string> o = kSmall;
    o.insert(o.end(), overrides.begin(), overrides.end());
    rendered = render(load_recipe(kRecipe, o), {"t1"});
  }
  KubeConfig config() {
    KubeConfig c;
    c.server = server.url();
    c.token = "good";
    c.source = "test config";
    c.auth_hint = "get a new token";
    return c;
  }
  WatchOptions watch_options() {
    WatchOptions o;
    o.ns = "olmo";
    o.jobset = rendered.jobset_name;
    o.run_dir = (dir / "run").string();
    o.poll_seconds = 0.05;
    o.retry_seconds = 0.05;
    o.max_minutes = 0.5;  // bounded: the test cannot hang
    o.max_iterations = 20000;
    return o;
  }
  ~Env() {
    server.stop();
    fs::remove_all(dir);
  }
};

std::vector<json> read_jsonl(const fs::path& p) {
  std::vector<json> out;
  std::ifstream f(p);
  std::string line;
  while (std::getline(f, line)) out.push_back(json::parse(line));
  return out;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const olmosft::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(K8sClient, LaunchAndWatchSurviveDroppedStreamAnd410) {
  Env e("complete");
  e.cluster.waiting_first = true;
  std::ostringstream log;
  LaunchResult lr = launch(e.client, e.rendered, false, log);
  EXPECT_EQ(lr.uid, "0f5e-uid-1234");
  EXPECT_EQ(e.cluster.configmaps.size(), 2u);
  // ConfigMaps are owned by the JobSet (garbage-collected with it).
  EXPECT_EQ(e.cluster.configmaps[e.rendered.jobset_name + "-recipe"]["metadata"]["ownerReferences"][0]["uid"],
            "0f5e-uid-1234");

  WatchResult r = watch_run(e.client, e.watch_options(), log);
  EXPECT_EQ(r.end_reason, "JobSet finished") << log.str();
  EXPECT_FALSE(r.stop_fired);
  EXPECT_EQ(r.last_step, 40);
  EXPECT_EQ(r.records_written, 40);
  EXPECT_GE(r.log_reconnects, 1);  // the dropped stream was resumed with sinceTime
  EXPECT_GE(r.relists, 3);         // initial list + relist after the ERROR/410 event + after the HTTP 410
  EXPECT_GE(e.cluster.pod_watches, 3);
  EXPECT_FALSE(e.cluster.since_times.empty());
  EXPECT_EQ(e.cluster.workload_patches, 0);
  EXPECT_EQ(e.cluster.jobset_patches, 0);
  EXPECT_EQ(e.cluster.answered_400.size(), 4u);  // every pod's first log request: "waiting to start", retried

  // Every step exactly once, in order, from the pod that logs LOSS-PARTS.
  auto recs = read_jsonl(e.dir / "run" / "steps.jsonl");
  ASSERT_EQ(recs.size(), 40u);
  for (int s = 1; s <= 40; ++s) {
    EXPECT_EQ(recs[s - 1]["step"], s);
    EXPECT_EQ(recs[s - 1]["pod"], e.cluster.pod_name(2));
    EXPECT_EQ(recs[s - 1]["tokens"], 812345);
    EXPECT_NEAR(recs[s - 1]["ce"].get<double>(), 2.0 - s * 0.01, 1e-9);
  }
  // Every pod's log saved, without duplicates, and without the torn half line of the broken stream.
  for (int i = 0; i < 4; ++i) {
    std::ifstream f(e.dir / "run" / "logs" / (e.cluster.pod_name(i) + ".log"));
    std::vector<std::string> lines;
    std::string l;
    while (std::getline(f, l)) lines.push_back(l);
    EXPECT_EQ(lines.size(), i == 2 ? 81u : 41u) << "pod " << i;
    EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()).size(), lines.size());
    for (const auto& x : lines) EXPECT_EQ(x.find("step=99"), std::string::npos);
  }
  auto events = read_jsonl(e.dir / "run" / "events.jsonl");
  bool saw_410 = false, saw_drop = false;
  for (const auto& ev : events) {
    saw_410 = saw_410 || (ev["event"] == "pod-watch-error" && ev["status"]["code"] == 410);
    saw_drop = saw_drop || ev["event"] == "log-stream-dropped";
  }
  EXPECT_TRUE(saw_410);
  EXPECT_TRUE(saw_drop);

  // Launching the same rendered run again: the JobSet exists (409) -> a clear message; ConfigMaps cleaned up.
  std::string m = message_of([&] { launch(e.client, e.rendered, false, log); });
  EXPECT_NE(m.find("409 AlreadyExists"), std::string::npos) << m;
}

TEST(K8sClient, RestartedWatcherContinuesWithoutDuplicates) {
  Env e("restart");
  e.cluster.drip_ms = 10;  // 40 steps in 0.4 s
  e.cluster.watch_410 = false;
  e.cluster.drop_after_lines = 0;
  std::ostringstream log;
  launch(e.client, e.rendered, false, log);
  WatchOptions o = e.watch_options();
  o.max_minutes = 0.002;  // the first watcher "dies" after 0.12 s
  WatchResult r1 = watch_run(e.client, o, log);
  EXPECT_EQ(r1.end_reason, "max minutes reached");
  EXPECT_LT(r1.last_step, 40);
  std::fprintf(stderr, "first watcher: last step %lld\n", static_cast<long long>(r1.last_step));
  WatchResult r2 = watch_run(e.client, e.watch_options(), log);
  EXPECT_EQ(r2.end_reason, "JobSet finished");
  EXPECT_EQ(r1.records_written + r2.records_written, 40);
  auto recs = read_jsonl(e.dir / "run" / "steps.jsonl");
  ASSERT_EQ(recs.size(), 40u);
  for (int s = 1; s <= 40; ++s) EXPECT_EQ(recs[s - 1]["step"], s);
  for (int i = 0; i < 4; ++i) {
    std::ifstream f(e.dir / "run" / "logs" / (e.cluster.pod_name(i) + ".log"));
    std::vector<std::string> lines;
    std::string l;
    while (std::getline(f, l)) lines.push_back(l);
    EXPECT_EQ(lines.size(), i == 2 ? 81u : 41u) << "pod " << i;
  }
  if (r1.last_step > 0) {
    EXPECT_GE(r2.log_reconnects, 1);  // resumed with sinceTime from the saved logs
  }
}

TEST(K8sClient, NanStopRuleFiresExactlyOnce) {
  Env e("nan");
  e.cluster.nan_at = 12;
  e.cluster.stall_after =
      20;  // the run keeps running (no progress) until it is stopped, however slow the watcher
  std::ostringstream log;
  launch(e.client, e.rendered, false, log);
  WatchResult r = watch_run(e.client, e.watch_options(), log);
  EXPECT_TRUE(r.stop_fired) << log.str();
  EXPECT_NE(r.stop_reason.find("nan_loss: step 12 ce=nan"), std::string::npos) << r.stop_reason;
  EXPECT_EQ(r.end_reason, "Workload deactivated and all pods gone") << log.str();
  EXPECT_EQ(e.cluster.workload_patches, 1);  // later NaN steps did not patch again
  EXPECT_EQ(e.cluster.jobset_patches, 0);    // never JobSet suspend
  EXPECT_TRUE(e.cluster.bad_content_types.empty());
  EXPECT_FALSE(e.cluster.active);
  EXPECT_GE(r.last_step, 12);
  auto stop = json::parse(std::ifstream(e.dir / "run" / "stop.json"));
  EXPECT_EQ(stop["workload_patched"], true);
  EXPECT_EQ(stop["workload"], "jobset-" + e.rendered.jobset_name + "-3c1a9");

  // A new watcher on the same run directory (the first host died): it must not fire or patch again.
  WatchResult r2 = watch_run(e.client, e.watch_options(), log);
  EXPECT_FALSE(r2.stop_fired);
  EXPECT_EQ(e.cluster.workload_patches, 1);
  // `k8s stop` on an inactive run: no patch.
  StopResult s = stop_run(e.client, "olmo", e.rendered.jobset_name);
  EXPECT_TRUE(s.already_inactive);
  EXPECT_FALSE(s.patched);
  EXPECT_EQ(e.cluster.workload_patches, 1);
  // status shows the eviction and the suspended JobSet.
  std::string st = format_status(run_status(e.client, "olmo", e.rendered.jobset_name));
  EXPECT_NE(st.find("active: no"), std::string::npos) << st;
  EXPECT_NE(st.find("Evicted: Deactivated"), std::string::npos) << st;
  EXPECT_NE(st.find("suspended: yes"), std::string::npos) << st;
}

TEST(K8sClient, RequiredRbfAndStallRules) {
  {
    Env e("rbf");
    e.cluster.rbf_high_at = 8;
    e.cluster.stall_after = 20;
    std::ostringstream log;
    launch(e.client, e.rendered, false, log);
    WatchResult r = watch_run(e.client, e.watch_options(), log);
    EXPECT_TRUE(r.stop_fired);
    EXPECT_NE(r.stop_reason.find("max_required_rbf: REQUIRED_RBF 2.7"), std::string::npos) << r.stop_reason;
    EXPECT_EQ(e.cluster.workload_patches, 1);
    EXPECT_EQ(e.cluster.jobset_patches, 0);
  }
  {
    Env e("stall");
    e.cluster.stall_after = 5;
    e.cluster.watch_410 = false;
    e.cluster.drop_after_lines = 0;
    std::ostringstream log;
    launch(e.client, e.rendered, false, log);
    WatchOptions o = e.watch_options();
    StopRules rules;
    rules.stall_minutes = 0.01;  // 0.6 s
    o.rules = rules;
    WatchResult r = watch_run(e.client, o, log);
    EXPECT_TRUE(r.stop_fired) << log.str();
    EXPECT_NE(r.stop_reason.find("stall_minutes: no new step"), std::string::npos) << r.stop_reason;
    EXPECT_NE(r.stop_reason.find("after step 5"), std::string::npos) << r.stop_reason;
    EXPECT_EQ(r.last_step, 5);
    EXPECT_EQ(e.cluster.workload_patches, 1);
    EXPECT_EQ(e.cluster.jobset_patches, 0);
  }
}

TEST(K8sClient, StallRuleWaitsWhilePreempted) {
  Env e("preempted-stall");
  e.cluster.stall_after = 5;
  e.cluster.watch_410 = false;
  std::ostringstream log;
  launch(e.client, e.rendered, false, log);
  {
    std::lock_guard<std::mutex> g(e.cluster.mu);
    e.cluster.workload["status"]["conditions"] =
        json::array({{{"type", "Evicted"}, {"status", "True"}, {"reason", "Preempted"}},
                     {{"type", "Admitted"}, {"status", "False"}, {"reason", "NoReservation"}}});
  }
  WatchOptions o = e.watch_options();
  StopRules rules;
  rules.stall_minutes = 0.01;  // 0.6 s
  o.rules = rules;
  o.max_minutes = 0.03;  // 1.8 s: three stall periods
  WatchResult r = watch_run(e.client, o, log);
  EXPECT_FALSE(r.stop_fired) << r.stop_reason;
  EXPECT_EQ(r.end_reason, "max minutes reached");
  EXPECT_EQ(r.last_step, 5);
  EXPECT_EQ(e.cluster.workload_patches, 0);
}

TEST(K8sClient, StopPatchesWorkloadNotJobSet) {
  Env e("stop");
  std::ostringstream log;
  launch(e.client, e.rendered, false, log);
  std::string st = format_status(run_status(e.client, "olmo", e.rendered.jobset_name));
  EXPECT_NE(st.find("admitted: yes"), std::string::npos) << st;
  EXPECT_NE(st.find("queue: post-training"), std::string::npos) << st;
  StopResult s = stop_run(e.client, "olmo", e.rendered.jobset_name);
  EXPECT_TRUE(s.patched);
  EXPECT_EQ(s.workload, "jobset-" + e.rendered.jobset_name + "-3c1a9");
  EXPECT_EQ(e.cluster.workload_patches, 1);
  EXPECT_EQ(e.cluster.jobset_patches, 0);
  EXPECT_TRUE(e.cluster.bad_content_types.empty());
  EXPECT_FALSE(stop_run(e.client, "olmo", e.rendered.jobset_name).patched);
  EXPECT_EQ(e.cluster.workload_patches, 1);
}

TEST(K8sClient, PreemptionShownInStatus) {
  Env e("preempt");
  std::ostringstream log;
  launch(e.client, e.rendered, false, log);
  {
    std::lock_guard<std::mutex> g(e.cluster.mu);
    e.cluster.workload["status"]["conditions"] = json::array(
        {{{"type", "Evicted"},
          {"status", "True"},
          {"reason", "Preempted"},
          {"message", "Preempted to accommodate a workload (UID: 1)"}},
         {{"type", "Preempted"}, {"status", "True"}, {"reason", "InClusterQueue"}, {"message", "by hero"}},
         {{"type", "Requeued"}, {"status", "True"}, {"reason", "Preempted"}}});
    e.cluster.workload["status"]["requeueState"] = {{"count", 2}};
    e.cluster.jobset["status"]["restarts"] = 1;
  }
  json st = run_status(e.client, "olmo", e.rendered.jobset_name);
  EXPECT_TRUE(st["workload"]["preempted"].get<bool>());
  EXPECT_TRUE(st["workload"]["evicted"].get<bool>());
  std::string text = format_status(st);
  EXPECT_NE(text.find("Evicted: Preempted: Preempted to accommodate"), std::string::npos) << text;
  EXPECT_NE(text.find("Preempted: InClusterQueue: by hero"), std::string::npos) << text;
  EXPECT_NE(text.find("restarts: 1"), std::string::npos) << text;
  EXPECT_NE(text.find("requeueState: {\"count\":2}"), std::string::npos) << text;
}

// ------------------------------------------------------------------ error messages

TEST(K8sClientErrors, ExpiredTokenAndRotation) {
  fakeapi::Server srv(
      [](const fakeapi::Request& rq) {
        auto it = rq.headers.find("authorization");
        if (it == rq.headers.end() || it->second != "Bearer fresh")
          return status(401, "Unauthorized", "Unauthorized");
        return js(200, {{"kind", "JobSet"}, {"metadata", {{"name", "x"}, {"uid", "u"}}}});
      },
      30);
  fs::path dir = scratch("auth");
  // kubeconfig with a static (expired) token.
  std::ofstream(dir / "kc")
      << "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster: {server: '"
      << srv.url() << "'}\ncontexts:\n- name: c\n  context: {cluster: k, user: me, namespace: olmo}\n"
      << "users:\n- name: me\n  user: {token: stale}\n";
  KubeConfig kc = load_kubeconfig((dir / "kc").string());
  EXPECT_EQ(kc.namespace_, "olmo");
  KubeClient c1(kc);
  std::string m = message_of([&] { c1.get(jobsets_path("olmo") + "/x", "get JobSet x"); });
  EXPECT_NE(m.find("get JobSet x: 401 Unauthorized"), std::string::npos) << m;
  EXPECT_NE(m.find("expired or revoked token"), std::string::npos) << m;
  EXPECT_NE(m.find("replace users[me].user.token in " + (dir / "kc").string()), std::string::npos) << m;

  // In-cluster: the service-account token file rotates; the client picks up the new one after a 401.
  fs::create_directories(dir / "sa");
  std::ofstream(dir / "sa" / "token") << "stale\n";
  std::ofstream(dir / "sa" / "namespace") << "olmo";
  auto env = map_env({{"KUBERNETES_SERVICE_HOST", "127.0.0.1"}, {"KUBERNETES_SERVICE_PORT", "1"}});
  KubeConfig ic = in_cluster_config((dir / "sa").string(), env);
  EXPECT_EQ(ic.server, "https://127.0.0.1:1");
  EXPECT_EQ(ic.namespace_, "olmo");
  ic.server = srv.url();  // the fake speaks plain HTTP
  KubeClient c2(ic);
  m = message_of([&] { c2.get(jobsets_path("olmo") + "/x", "get JobSet x"); });
  EXPECT_NE(m.find("401 Unauthorized"), std::string::npos) << m;
  EXPECT_NE(m.find("was re-read and still rejected"), std::string::npos) << m;
  std::ofstream(dir / "sa" / "token") << "fresh\n";  // kubelet rotated it
  EXPECT_EQ(c2.get(jobsets_path("olmo") + "/x", "get JobSet x")["metadata"]["uid"], "u");
  srv.stop();
  fs::remove_all(dir);
}

TEST(K8sClientErrors, ForbiddenAndMissingCrds) {
  fakeapi::Server srv(
      [](const fakeapi::Request& rq) {
        if (rq.path.rfind("/apis/kueue.x-k8s.io/v1beta2/namespaces/olmo/workloads/", 0) == 0)
          return status(403, "Forbidden",
                        "workloads.kueue.x-k8s.io \\\"w\\\" is forbidden: User "
                        "\\\"system:serviceaccount:olmo:agent\\\" "
                        "cannot patch resource \\\"workloads\\\" in API group \\\"kueue.x-k8s.io\\\" in the "
                        "namespace \\\"olmo\\\"");
        if (rq.path.rfind("/apis/jobset.x-k8s.io", 0) == 0)
          return status(404, "NotFound", "the server could not find the requested resource");
        if (rq.path == "/api/v1/namespaces/olmo/pods/p1/log")
          return status(404, "NotFound", "pods \\\"p1\\\" not found");
        if (rq.path == "/api") return js(200, {{"kind", "APIVersions"}, {"versions", {"v1"}}});
        return status(404, "NotFound", "the server could not find the requested resource");
      },
      30);
  KubeConfig cfg;
  cfg.server = srv.url();
  cfg.token = "t";
  cfg.source = "test";
  KubeClient c(cfg);
  std::string m = message_of([&] {
    c.merge_patch("/apis/kueue.x-k8s.io/v1beta2/namespaces/olmo/workloads/w", {{"spec", {{"active", false}}}},
                  "deactivate Workload w");
  });
  EXPECT_NE(m.find("deactivate Workload w: 403 Forbidden"), std::string::npos) << m;
  EXPECT_NE(m.find("grant this identity RBAC verb 'patch' on 'workloads.kueue.x-k8s.io' in namespace 'olmo'"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("workload-editor"), std::string::npos) << m;
  m = message_of([&] { c.get(jobsets_path("olmo") + "/x", "get JobSet x"); });
  EXPECT_NE(m.find("404: the API jobset.x-k8s.io/v1alpha2 is not served"), std::string::npos) << m;
  EXPECT_NE(m.find("CRDs are missing"), std::string::npos) << m;
  EXPECT_NE(m.find("install JobSet"), std::string::npos) << m;
  // A launch stops at discovery, before creating anything.
  Rendered rd = render(load_recipe(kRecipe, kSmall), {"t2"});
  std::ostringstream log;
  m = message_of([&] { launch(c, rd, false, log); });
  EXPECT_NE(m.find("JobSet API discovery: 404: the API jobset.x-k8s.io/v1alpha2 is not served"),
            std::string::npos)
      << m;
  EXPECT_EQ(log.str(), "");
  // Kueue missing.
  m = message_of([&] { kueue_version(c); });
  EXPECT_NE(m.find("Kueue API discovery: 404"), std::string::npos) << m;
  // A plain missing object (core API) is not reported as a missing CRD.
  m = message_of([&] { c.get("/api/v1/namespaces/olmo/pods/p1/log", "read pod p1"); });
  EXPECT_NE(m.find("read pod p1: 404 Not Found: pods \"p1\" not found"), std::string::npos) << m;
  srv.stop();
}

// A server that 404s everything (a web server, a proxy's landing page: the wrong URL in the kubeconfig) is
// not reported as "JobSet CRDs are missing" (issue #17): the client asks GET /api first.
TEST(K8sClientErrors, NotAKubernetesServer) {
  fakeapi::Server srv(
      [](const fakeapi::Request&) {
        return fakeapi::Response{404, "<html>Not Found</html>"};
      },
      30);
  KubeConfig cfg;
  cfg.server = srv.url();
  cfg.token = "t";
  cfg.source = "test-kubeconfig";
  KubeClient c(cfg);
  const std::string m = message_of([&] { c.get(jobsets_path("olmo") + "/x", "get JobSet x"); });
  EXPECT_NE(m.find("does not answer like a Kubernetes API server"), std::string::npos) << m;
  EXPECT_NE(m.find("check the server URL in test-kubeconfig"), std::string::npos) << m;
  EXPECT_EQ(m.find("CRDs are missing"), std::string::npos) << m;
  srv.stop();
}

TEST(K8sClientErrors, BadKubeconfigs) {
  fs::path dir = scratch("kc");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  std::string p = write("notyaml", "apiVersion: v1\nclusters: [\n");
  std::string m = message_of([&] { load_kubeconfig(p); });
  EXPECT_NE(m.find("kubeconfig " + p + ": not valid YAML"), std::string::npos) << m;
  p = write("noctx", "apiVersion: v1\nkind: Config\nclusters: []\n");
  m = message_of([&] { load_kubeconfig(p); });
  EXPECT_NE(m.find("no current-context; pass --context NAME"), std::string::npos) << m;
  p = write("noserver",
            "current-context: c\nclusters:\n- name: k\n  cluster: {}\ncontexts:\n- name: c\n  context: "
            "{cluster: k, user: "
            "u}\nusers:\n- name: u\n  user: {token: t}\n");
  m = message_of([&] { load_kubeconfig(p); });
  EXPECT_NE(m.find("cluster 'k' has no server URL (clusters[].cluster.server)"), std::string::npos) << m;
  p = write(
      "nouser",
      "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://x'}\ncontexts:\n- name: c\n  "
      "context: {cluster: k, user: ghost}\nusers: []\n");
  m = message_of([&] { load_kubeconfig(p); });
  EXPECT_NE(m.find("users has no entry named 'ghost'"), std::string::npos) << m;
  p = write(
      "authprov",
      "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://x'}\ncontexts:\n- name: c\n  "
      "context: {cluster: k, user: u}\nusers:\n- name: u\n  user: {auth-provider: {name: gcp}}\n");
  m = message_of([&] { load_kubeconfig(p); });
  EXPECT_NE(m.find("gke-gcloud-auth-plugin"), std::string::npos) << m;
  p = write(
      "nocreds",
      "current-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://x'}\ncontexts:\n- name: c\n  "
      "context: {cluster: k, user: u}\nusers:\n- name: u\n  user: {}\n");
  m = message_of([&] { load_kubeconfig(p); });
  EXPECT_NE(m.find("has no credentials"), std::string::npos) << m;
  m = message_of([&] { load_kubeconfig((dir / "missing").string()); });
  EXPECT_NE(m.find("kubeconfig " + (dir / "missing").string() + ": cannot read (no such file)"),
            std::string::npos)
      << m;
  m = message_of([&] { resolve_config("", "", map_env({{"HOME", dir.string()}})); });
  EXPECT_NE(m.find(".kube/config does not exist; pass --kubeconfig FILE"), std::string::npos) << m;

  // An exec plugin (gke-gcloud-auth-plugin style) that fails: the message says to log in again.
  p = write("exec",
            "current-context: c\nclusters:\n- name: k\n  cluster: {server: "
            "'http://127.0.0.1:1'}\ncontexts:\n- name: c\n"
            "  context: {cluster: k, user: u}\nusers:\n- name: u\n  user:\n    exec: {command: /bin/false, "
            "apiVersion: "
            "client.authentication.k8s.io/v1beta1}\n");
  KubeClient ce(load_kubeconfig(p));
  m = message_of([&] { ce.get("/api", "discovery"); });
  EXPECT_NE(m.find("exec credential plugin '/bin/false'"), std::string::npos) << m;
  EXPECT_NE(m.find("gcloud auth login"), std::string::npos) << m;
  // An exec plugin that works: its ExecCredential token is sent.
  fakeapi::Server srv(
      [](const fakeapi::Request& rq) {
        auto it = rq.headers.find("authorization");
        return it != rq.headers.end() && it->second == "Bearer from-plugin"
                   ? js(200, {{"ok", true}})
                   : status(401, "Unauthorized", "no");
      },
      30);
  write(
      "plugin.sh",
      "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\","
      "\"status\":{\"token\":\"from-plugin\",\"expirationTimestamp\":\"2099-01-01T00:00:00Z\"}}'\n");
  fs::permissions(dir / "plugin.sh", fs::perms::owner_all);
  p = write("exec-ok",
            "current-context: c\nclusters:\n- name: k\n  cluster: {server: '" + srv.url() +
                "'}\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nusers:\n- name: u\n  user:\n"
                "    exec: {command: ./plugin.sh}\n");
  KubeClient cp(load_kubeconfig(p));
  EXPECT_EQ(cp.get("/api", "discovery")["ok"], true);
  srv.stop();

  // Unreachable server: names the server and where it came from.
  KubeConfig dead;
  dead.server = "http://127.0.0.1:1";
  dead.token = "t";
  dead.source = "kubeconfig /x (context c)";
  KubeClient cd(dead);
  m = message_of([&] { cd.get("/api", "discovery"); });
  EXPECT_NE(m.find("cannot reach the API server http://127.0.0.1:1"), std::string::npos) << m;
  EXPECT_NE(m.find("check the server URL in kubeconfig /x (context c)"), std::string::npos) << m;
  fs::remove_all(dir);
}

TEST(K8sClientErrors, CliPrintsTheFix) {
  fs::path dir = scratch("cli");
  std::ofstream(dir / "kc") << "apiVersion: v1\nkind: Config\nclusters: []\n";
  std::string cmd =
      std::string(OLMOSFT_BINARY) + " k8s status some-run --kubeconfig " + (dir / "kc").string() + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_TRUE(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int rc = ::pclose(f);
  EXPECT_NE(rc, 0);
  EXPECT_EQ(out.rfind("olmosft k8s status: error: kubeconfig ", 0), 0u) << out;
  EXPECT_NE(out.find("olmosft k8s status: error: kubeconfig " + (dir / "kc").string() +
                     ": no current-context; pass --context NAME"),
            std::string::npos)
      << out;
  fs::remove_all(dir);
}

std::string run_cmd(const std::string& cmd, int& rc) {
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (f && (n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  rc = f ? ::pclose(f) : -1;
  return out;
}

TEST(K8sCli, LaunchWatchStatusStop) {
  Env e("cli-e2e");
  e.cluster.nan_at = 6;
  e.cluster.stall_after = 20;
  std::ofstream(e.dir / "kc")
      << "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster: {server: '"
      << e.server.url() << "'}\ncontexts:\n- name: c\n  context: {cluster: k, user: u, namespace: olmo}\n"
      << "users:\n- name: u\n  user: {token: good}\n";
  const std::string bin = std::string(OLMOSFT_BINARY) + " ";
  const std::string kc = " --kubeconfig " + (e.dir / "kc").string();
  std::string overrides;
  for (const auto& o : kSmall) overrides += " '" + o + "'";
  int rc = 0;
  std::string out = run_cmd(
      bin + "k8s launch " + kRecipe + overrides + " --suffix t1 --out " + (e.dir / "m").string() + kc, rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("jobset/olmo35-sft-h045-tpu-t1 created uid=0f5e-uid-1234"), std::string::npos) << out;
  out = run_cmd(bin + "k8s watch olmo35-sft-h045-tpu-t1 --poll-seconds 0.05 --max-minutes 0.5 --run-dir " +
                    (e.dir / "run").string() + kc,
                rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("stop rule fired: nan_loss: step 6 ce=nan"), std::string::npos) << out;
  EXPECT_NE(out.find("watch ended: Workload deactivated and all pods gone"), std::string::npos) << out;
  EXPECT_EQ(e.cluster.workload_patches, 1);
  EXPECT_EQ(e.cluster.jobset_patches, 0);
  out = run_cmd(bin + "k8s status olmo35-sft-h045-tpu-t1" + kc, rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("Evicted: Deactivated"), std::string::npos) << out;
  out = run_cmd(bin + "k8s stop olmo35-sft-h045-tpu-t1" + kc, rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("already inactive"), std::string::npos) << out;
  EXPECT_EQ(e.cluster.workload_patches, 1);
}

TEST(K8sLogParsing, LossPartsAndRbf) {
  auto r = parse_loss_parts(
      "I1202 12:00:00 LOSS-PARTS step=12 ce=0.912345 lm_z=0.000123 moe_lb=0.010012 router_z=0.000045 "
      "tokens=812345");
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)["step"], 12);
  EXPECT_DOUBLE_EQ((*r)["ce"].get<double>(), 0.912345);
  EXPECT_EQ((*r)["tokens"], 812345);
  r = parse_loss_parts("LOSS-PARTS step=3 ce=nan lm_z=0.000000 moe_lb=0.000000 router_z=0.000000 tokens=4");
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)["ce"], "nan");
  EXPECT_FALSE(parse_loss_parts("LOSS-PARTS step=3 ce=nan"));  // fields missing
  EXPECT_FALSE(parse_loss_parts("LOSS-PARTS ce=1"));
  EXPECT_FALSE(parse_loss_parts("LOSS-PARTS step=x ce=1"));
  EXPECT_FALSE(parse_loss_parts("completed step: 3, loss: 1.2"));
  auto rbf = parse_required_rbf("2025-12-02T00:00:01Z REQUIRED_RBF step=7 value=2.240000");
  ASSERT_TRUE(rbf);
  EXPECT_EQ(rbf->step, 7);
  EXPECT_DOUBLE_EQ(rbf->value, 2.24);
  EXPECT_FALSE(parse_required_rbf("REQUIRED_RBF=2.24"));  // not the trainer's line
  EXPECT_FALSE(parse_required_rbf("REQUIRED_RBF step=7 value=?"));
  EXPECT_EQ(parse_rfc3339_ns("2025-12-02T00:00:01.25Z"), 1764633601250000000LL);
  EXPECT_EQ(parse_rfc3339_ns("2025-12-02T01:00:01+01:00"), 1764633601000000000LL);
  EXPECT_EQ(parse_rfc3339_ns("2025-12-02 00:00:01Z"), -1);
  EXPECT_EQ(format_rfc3339(1764633601250000000LL), "2025-12-02T00:00:01Z");
  EXPECT_EQ(format_rfc3339(1764633601250000000LL, true), "2025-12-02T00:00:01.250000000Z");
}

// The defect this guards: `k8s watch`'s max_required_rbf rule read REQUIRED_RBF lines that no trainer
// printed. Here the pod log is a REAL trainer log: a 2-step `olmosft train` of the tiny hybrid (MoE) fixture,
// whose REQUIRED_RBF lines the fake API serves as the loss pod's log. The rule (from the launched recipe
// ConfigMap) fires with a limit just below the largest logged value, and stays quiet with the largest value
// as the limit.
TEST(K8sCli, RequiredRbfRuleFiresOnARealTrainerLog) {
  const fs::path d = scratch("real-trainer-log");
  const std::string G = std::string(OLMOSFT_SOURCE_DIR) + "/tests/golden";
  const std::string bin = std::string(OLMOSFT_BINARY) + " ";
  int rc = 0;
  std::string out =
      run_cmd("OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 " + bin + "data build --input " + G +
                  "/data/convs.jsonl --tokenizer builtin:bytes --seq-len 256 --seed 3 --epochs 4 " +
                  "--quiet --out " + (d / "data").string(),
              rc);
  ASSERT_EQ(rc, 0) << out;
  std::ofstream(d / "recipe.yaml")
      << "run_name: rbf\noutput_dir: " << (d / "runs").string() << "\nmodel:\n  init: " << G
      << "/model/olmo3moe_tiny\ntokenizer: builtin:bytes\ndata:\n  path: " << (d / "data").string()
      << "\n  epochs: 4\nseq_len: 256\nglobal_batch: 2\nper_device_batch: 2\nsteps: 2\n"
      << "optimizer:\n  lr: 3e-3\n  schedule: constant\n  warmup_frac: 0.0\n"
      << "loss:\n  lm_z: 1e-5\n  moe_lb: 0.01\n  router_z: 1e-5\ncompute:\n  threads: 2\n"
      << "perf:\n  peak_tflops: 1\neval:\n  heldout: 2\nlog:\n  tensorboard: false\n";
  out = run_cmd(
      "OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 " + bin + "train " + (d / "recipe.yaml").string(), rc);
  ASSERT_EQ(rc, 0) << out;
  std::vector<std::string> log_lines;
  std::vector<olmosft::train::RequiredRbfLine> rbfs;
  int loss_lines = 0;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    log_lines.push_back(l);
    if (auto r = olmosft::train::parse_required_rbf_line(l)) rbfs.push_back(*r);
    loss_lines += olmosft::train::parse_loss_parts_line(l).has_value();
  }
  ASSERT_EQ(rbfs.size(), 2u) << out;  // one per step (MoE model)
  ASSERT_EQ(loss_lines, 2) << out;
  EXPECT_EQ(rbfs[0].step, 1);
  EXPECT_EQ(rbfs[1].step, 2);
  const auto top = std::max_element(rbfs.begin(), rbfs.end(),
                                    [](const auto& a, const auto& b) { return a.value < b.value; });
  EXPECT_GE(top->value, 1.0) << out;  // max expert load / balanced load
  fs::remove_all(d);

  const double lim = std::round((top->value - 1e-3) * 1e6) / 1e6;  // what "%.6f" prints and parses back
  char limit[64];
  std::snprintf(limit, sizeof limit, "cluster.stop_rules.max_required_rbf=%.6f", lim);
  int64_t first_over = 0;  // the step the rule fires at: the first whose value exceeds the limit
  for (const auto& r : rbfs)
    if (!first_over && r.value > lim) first_over = r.step;
  {
    Env e("real-log-fires", {limit});
    e.cluster.script = log_lines;
    e.cluster.steps = static_cast<int>(log_lines.size());
    e.cluster.drop_after_lines = 0;
    std::ostringstream log;
    launch(e.client, e.rendered, false, log);
    WatchResult r = watch_run(e.client, e.watch_options(), log);
    EXPECT_TRUE(r.stop_fired) << log.str();
    EXPECT_NE(r.stop_reason.find("max_required_rbf: REQUIRED_RBF"), std::string::npos) << r.stop_reason;
    EXPECT_NE(r.stop_reason.find("at step " + std::to_string(first_over)), std::string::npos)
        << r.stop_reason;
    EXPECT_EQ(e.cluster.workload_patches, 1);
  }
  std::snprintf(limit, sizeof limit, "cluster.stop_rules.max_required_rbf=%.6f", top->value);
  {
    Env e("real-log-quiet", {limit});
    e.cluster.script = log_lines;
    e.cluster.steps = static_cast<int>(log_lines.size());
    e.cluster.drop_after_lines = 0;
    std::ostringstream log;
    launch(e.client, e.rendered, false, log);
    WatchResult r = watch_run(e.client, e.watch_options(), log);
    EXPECT_FALSE(r.stop_fired) << r.stop_reason;
    EXPECT_EQ(r.records_written, 2) << log.str();  // the real LOSS-PARTS lines, as steps.jsonl records
    EXPECT_EQ(r.last_step, 2);
    EXPECT_EQ(e.cluster.workload_patches, 0);
  }
}
