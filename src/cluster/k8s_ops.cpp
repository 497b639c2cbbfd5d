#include "cluster/k8s_ops.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cluster/timeutil.h"
#include "io/atomic_file.h"

namespace olmosft::cluster {

using json = nlohmann::json;

std::string jobsets_path(const std::string& ns) {
  return "/apis/jobset.x-k8s.io/v1alpha2/namespaces/" + ns + "/jobsets";
}
std::string workloads_path(const std::string& ns, const std::string& v) {
  return "/apis/kueue.x-k8s.io/" + v + "/namespaces/" + ns + "/workloads";
}
std::string pods_path(const std::string& ns) { return "/api/v1/namespaces/" + ns + "/pods"; }

namespace {

std::string jobset_selector(const std::string& js) {
  return url_escape("jobset.sigs.k8s.io/jobset-name=" + js);
}

std::string cond_summary(const json& conds) {
  std::string o;
  if (!conds.is_array()) return o;
  for (const auto& c : conds) {
    o += (o.empty() ? "" : ", ") + c.value("type", "?") + "=" + c.value("status", "?");
    std::string reason = c.value("reason", "");
    if (!reason.empty()) o += " (" + reason + ")";
  }
  return o;
}

bool cond_true(const json& obj, const std::string& type) {
  const json& conds =
      obj.contains("status") ? obj["status"].value("conditions", json::array()) : json::array();
  for (const auto& c : conds)
    if (c.value("type", "") == type) return c.value("status", "") == "True";
  return false;
}

// Appends one line to a file and fsyncs it (the durable record).
class DurableLog {
 public:
  DurableLog() = default;
  explicit DurableLog(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    OLMO_CHECK(fd_ >= 0, "run directory: cannot open ", path, ": ", std::strerror(errno));
  }
  ~DurableLog() {
    if (fd_ >= 0) ::close(fd_);
  }
  DurableLog(const DurableLog&) = delete;
  DurableLog& operator=(const DurableLog&) = delete;
  void append(const std::string& data, bool sync) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd_, data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      OLMO_CHECK(n >= 0, "run directory: write ", path_, ": ", std::strerror(errno));
      off += static_cast<size_t>(n);
    }
    dirty_ = true;
    if (sync) this->sync();
  }
  void sync() {
    if (dirty_ && fd_ >= 0) ::fdatasync(fd_);
    dirty_ = false;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool dirty_ = false;
};

}  // namespace

// ---------------------------------------------------------------- discovery, workload lookup

std::string kueue_version(KubeClient& c) {
  json g = c.get("/apis/kueue.x-k8s.io", "Kueue API discovery");
  std::string v = g.value("preferredVersion", json::object()).value("version", "");
  OLMO_CHECK(!v.empty(), "Kueue API discovery: /apis/kueue.x-k8s.io has no preferredVersion");
  return v;
}

std::optional<json> find_workload(KubeClient& c, const std::string& ns, const std::string& uid,
                                  const std::string& v) {
  json l = c.get(workloads_path(ns, v) + "?labelSelector=" + url_escape("kueue.x-k8s.io/job-uid=" + uid),
                 "find the Kueue Workload of JobSet uid " + uid);
  const json& items = l.value("items", json::array());
  if (items.empty()) return std::nullopt;
  OLMO_CHECK(items.size() == 1, "find the Kueue Workload of JobSet uid ", uid, ": ", items.size(),
             " Workloads carry that label; expected one");
  return items[0];
}

// ---------------------------------------------------------------- launch / stop / status

LaunchResult launch(KubeClient& c, const Rendered& r, bool dry_run, std::ostream& log) {
  const json jobset = json::parse(r.objects.back().second.dump());
  const std::string ns = jobset["metadata"].value("namespace", "default");
  // Fail before creating anything if the CRDs or the queue are missing.
  c.get("/apis/jobset.x-k8s.io/v1alpha2", "JobSet API discovery");
  const std::string kv = kueue_version(c);
  const std::string queue = jobset["metadata"]["labels"].value("kueue.x-k8s.io/queue-name", "");
  if (!queue.empty()) {
    HttpResult q = c.raw("GET", "/apis/kueue.x-k8s.io/" + kv + "/namespaces/" + ns + "/localqueues/" + queue);
    if (q.status == 404)
      fail("launch: Kueue LocalQueue '", queue, "' does not exist in namespace '", ns,
           "'; the JobSet would stay suspended forever. Fix cluster.queue / cluster.namespace in the recipe "
           "(kubectl -n ",
           ns, " get localqueues)");
    if (q.status < 200 || q.status >= 300)
      throw KubeError(
          c.explain(q, "GET", "/apis/kueue.x-k8s.io/" + kv + "/namespaces/" + ns + "/localqueues/" + queue,
                    "check LocalQueue " + queue),
          q.status, "");
  }
  const std::string dry = dry_run ? "?dryRun=All" : "";
  std::vector<std::string> created_cms;
  try {
    for (size_t i = 0; i + 1 < r.objects.size(); ++i) {
      json obj = json::parse(r.objects[i].second.dump());
      OLMO_CHECK(obj.value("kind", "") == "ConfigMap", "launch: unexpected object kind ",
                 obj.value("kind", ""));
      const std::string name = obj["metadata"]["name"];
      c.post("/api/v1/namespaces/" + ns + "/configmaps" + dry, obj, "create ConfigMap " + name);
      if (!dry_run) created_cms.push_back(name);
      log << "configmap/" << name << " created" << (dry_run ? " (server dry run)" : "") << "\n";
    }
    json made = c.post(jobsets_path(ns) + dry, jobset, "create JobSet " + r.jobset_name);
    LaunchResult out{r.jobset_name, made["metadata"].value("uid", ""), ns};
    log << "jobset/" << r.jobset_name << " created" << (dry_run ? " (server dry run)" : "")
        << " uid=" << out.uid << "\n";
    if (!dry_run && !out.uid.empty()) {
      // Garbage-collect the ConfigMaps with the JobSet.
      json owner = {{"metadata",
                     {{"ownerReferences", json::array({{{"apiVersion", "jobset.x-k8s.io/v1alpha2"},
                                                        {"kind", "JobSet"},
                                                        {"name", r.jobset_name},
                                                        {"uid", out.uid}}})}}}};
      for (const auto& cm : created_cms)
        c.merge_patch("/api/v1/namespaces/" + ns + "/configmaps/" + cm, owner,
                      "set the owner of ConfigMap " + cm);
    }
    return out;
  } catch (...) {
    for (const auto& cm : created_cms) c.raw("DELETE", "/api/v1/namespaces/" + ns + "/configmaps/" + cm);
    throw;
  }
}

StopResult stop_run(KubeClient& c, const std::string& ns, const std::string& js) {
  json jobset = c.get(jobsets_path(ns) + "/" + js, "get JobSet " + js);
  const std::string uid = jobset["metadata"].value("uid", "");
  const std::string kv = kueue_version(c);
  auto wl = find_workload(c, ns, uid, kv);
  OLMO_CHECK(wl.has_value(), "stop ", js, ": no Kueue Workload has label kueue.x-k8s.io/job-uid=", uid,
             "; is the JobSet queued through Kueue (label kueue.x-k8s.io/queue-name)? Without Kueue, delete "
             "the JobSet");
  StopResult r;
  r.workload = (*wl)["metadata"]["name"];
  if ((*wl)["spec"].value("active", true) == false) {
    r.already_inactive = true;
    return r;
  }
  c.merge_patch(workloads_path(ns, kv) + "/" + r.workload, json{{"spec", {{"active", false}}}},
                "deactivate Workload " + r.workload);
  r.patched = true;
  return r;
}

json run_status(KubeClient& c, const std::string& ns, const std::string& js) {
  json out;
  json jobset = c.get(jobsets_path(ns) + "/" + js, "get JobSet " + js);
  const json& st = jobset.value("status", json::object());
  out["jobset"] = {{"name", js},
                   {"namespace", ns},
                   {"uid", jobset["metadata"].value("uid", "")},
                   {"suspend", jobset["spec"].value("suspend", false)},
                   {"terminalState", st.value("terminalState", "")},
                   {"restarts", st.value("restarts", 0)},
                   {"conditions", st.value("conditions", json::array())}};
  const std::string kv = kueue_version(c);
  auto wl = find_workload(c, ns, out["jobset"]["uid"], kv);
  if (wl) {
    const json& ws = wl->value("status", json::object());
    out["workload"] = {{"name", (*wl)["metadata"]["name"]},
                       {"active", (*wl)["spec"].value("active", true)},
                       {"queue", (*wl)["spec"].value("queueName", "")},
                       {"admitted", cond_true(*wl, "Admitted")},
                       {"evicted", cond_true(*wl, "Evicted")},
                       {"preempted", cond_true(*wl, "Preempted")},
                       {"conditions", ws.value("conditions", json::array())},
                       {"requeueState", ws.value("requeueState", json::object())}};
  } else {
    out["workload"] = nullptr;
  }
  json pods = c.get(pods_path(ns) + "?labelSelector=" + jobset_selector(js), "list pods of " + js);
  std::map<std::string, int> phases;
  std::set<std::string> attempts;
  int container_restarts = 0;
  for (const auto& p : pods.value("items", json::array())) {
    phases[p["status"].value("phase", "Unknown")]++;
    const json& l = p["metadata"].value("labels", json::object());
    attempts.insert(l.value("jobset.sigs.k8s.io/restart-attempt", "?"));
    for (const auto& cs : p["status"].value("containerStatuses", json::array()))
      container_restarts += cs.value("restartCount", 0);
  }
  out["pods"] = {
      {"phases", phases}, {"restartAttempts", attempts}, {"containerRestarts", container_restarts}};
  return out;
}

std::string format_status(const json& st) {
  std::ostringstream o;
  const json& j = st["jobset"];
  o << "jobset " << j["name"].get<std::string>() << " (namespace " << j["namespace"].get<std::string>()
    << ")\n"
    << "  state: "
    << (j["terminalState"].get<std::string>().empty() ? "running" : j["terminalState"].get<std::string>())
    << "  restarts: " << j["restarts"] << "  suspended: " << (j["suspend"].get<bool>() ? "yes" : "no") << "\n"
    << "  conditions: " << cond_summary(j["conditions"]) << "\n";
  if (st["workload"].is_null()) {
    o << "workload: none yet (Kueue has not created it; is the queue label right and Kueue running?)\n";
  } else {
    const json& w = st["workload"];
    o << "workload " << w["name"].get<std::string>() << "  queue: " << w["queue"].get<std::string>()
      << "  active: " << (w["active"].get<bool>() ? "yes" : "no")
      << "  admitted: " << (w["admitted"].get<bool>() ? "yes" : "no")
      << "\n  conditions: " << cond_summary(w["conditions"]) << "\n";
    for (const auto& c : w["conditions"])
      if ((c.value("type", "") == "Evicted" || c.value("type", "") == "Preempted") &&
          c.value("status", "") == "True")
        o << "  " << c.value("type", "") << ": " << c.value("reason", "") << ": " << c.value("message", "")
          << "\n";
    if (!w["requeueState"].empty()) o << "  requeueState: " << w["requeueState"].dump() << "\n";
  }
  o << "pods:";
  for (const auto& [k, v] : st["pods"]["phases"].items()) o << " " << k << "=" << v;
  if (st["pods"]["phases"].empty()) o << " none";
  o << "  restart attempts: " << st["pods"]["restartAttempts"].dump()
    << "  container restarts: " << st["pods"]["containerRestarts"] << "\n";
  return o.str();
}

// ---------------------------------------------------------------- log parsing

namespace {
// JSON has no NaN: non-finite values are kept as text ("nan", "inf").
json num(double v) {
  if (std::isfinite(v)) return v;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%f", v);
  return buf;
}
}  // namespace

std::optional<json> parse_loss_parts(const std::string& text) {
  auto l = train::parse_loss_parts_line(text);
  if (!l || l->step < 0) return std::nullopt;
  json j{{"step", l->step}, {"tokens", l->tokens}};
  for (size_t t = 0; t < model::kLossTermCount; ++t) j[model::kLossTerms[t].name] = num(l->terms[t]);
  return j;
}

std::optional<train::RequiredRbfLine> parse_required_rbf(const std::string& text) {
  return train::parse_required_rbf_line(text);
}

// ---------------------------------------------------------------- watch

namespace {

struct PodState {
  std::string phase;
  bool terminated = false;  // the watched container has terminated
  bool deleted = false;
  bool log_done = false;
  int stream = 0;  // active stream id, 0 if none
  int attempt = 0;
  int64_t last_ts = -1;
  std::set<std::string> at_last_ts;
  int64_t retry_at = 0;  // ns, earliest reconnect
  bool ever_connected = false;
  std::unique_ptr<DurableLog> file;
};

class Watcher {
 public:
  Watcher(KubeClient& c, const WatchOptions& o, std::ostream& log) : c_(c), o_(o), log_(log), streams_(c) {}

  WatchResult run() {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(o_.run_dir + "/logs", ec);
    OLMO_CHECK(!ec, "watch: cannot create the run directory ", o_.run_dir, "/logs: ", ec.message());
    steps_ = std::make_unique<DurableLog>(o_.run_dir + "/steps.jsonl");
    events_ = std::make_unique<DurableLog>(o_.run_dir + "/events.jsonl");
    load_previous();

    json jobset = c_.get(jobsets_path(o_.ns) + "/" + o_.jobset, "get JobSet " + o_.jobset);
    uid_ = jobset["metadata"].value("uid", "");
    io::write_file_atomic(o_.run_dir + "/jobset.json", jobset.dump(2) + "\n");
    kv_ = kueue_version(c_);
    if (o_.rules) {
      rules_ = *o_.rules;
    } else {
      json cm = c_.get("/api/v1/namespaces/" + o_.ns + "/configmaps/" + o_.jobset + "-recipe",
                       "read the run's recipe ConfigMap " + o_.jobset + "-recipe (for its stop rules)");
      const std::string text = cm["data"].value("recipe.yaml", "");
      rules_ = parse_recipe(text, "ConfigMap " + o_.jobset + "-recipe/recipe.yaml", {}).cluster.stop_rules;
    }
    event("watch-start", {{"jobset", o_.jobset}, {"uid", uid_}, {"last_step", res_.last_step}});

    const auto t0 = std::chrono::steady_clock::now();
    auto last_poll = t0 - std::chrono::hours(1);
    for (long it = 0;; ++it) {
      if (o_.max_iterations > 0 && it >= o_.max_iterations) {
        res_.end_reason = "iteration limit reached";
        break;
      }
      const auto now = std::chrono::steady_clock::now();
      if (o_.max_minutes > 0 && now - t0 > std::chrono::duration<double>(o_.max_minutes * 60)) {
        res_.end_reason = "max minutes reached";
        break;
      }
      if (need_relist_) relist();
      if (!watching_ && !need_relist_) start_pod_watch();
      start_log_streams();
      streams_.poll(100);
      if (now - last_poll > std::chrono::duration<double>(o_.poll_seconds)) {
        last_poll = now;
        refresh_run();
      }
      check_stall();
      if (patch_pending_) try_patch();
      for (auto& [n, p] : pods_)
        if (p.file) p.file->sync();
      if (finished()) break;
    }
    for (auto& [n, p] : pods_)
      if (p.file) p.file->sync();
    event("watch-end", {{"reason", res_.end_reason}, {"last_step", res_.last_step}});
    return res_;
  }

 private:
  void event(const std::string& type, json extra) {
    extra["event"] = type;
    extra["time"] = format_rfc3339(now_ns(), true);
    events_->append(extra.dump() + "\n", true);
  }

  void load_previous() {
    std::ifstream f(o_.run_dir + "/steps.jsonl");
    std::string line;
    while (std::getline(f, line)) {
      try {
        json r = json::parse(line);
        seen_.insert({r.value("restart_attempt", 0), r.value("step", int64_t{0})});
        res_.last_step = std::max<int64_t>(res_.last_step, r.value("step", int64_t{0}));
      } catch (...) {
        // A torn last line (host died mid-write) is ignored; the step will be recorded again if still in the
        // log.
      }
    }
    std::ifstream s(o_.run_dir + "/stop.json");
    if (s) {
      fired_ = true;
      try {
        json j = json::parse(s);
        patch_pending_ = !j.value("workload_patched", false);
        stop_reason_ = j.value("reason", "");
      } catch (...) {
        patch_pending_ = true;
      }
    }
  }

  void update_pod(const json& p) {
    const std::string name = p["metadata"].value("name", "");
    if (name.empty()) return;
    PodState& s = pods_[name];
    s.phase = p["status"].value("phase", "Pending");
    const json& labels = p["metadata"].value("labels", json::object());
    s.attempt = std::atoi(labels.value("jobset.sigs.k8s.io/restart-attempt", "0").c_str());
    if (s.attempt > max_attempt_) {
      // A JobSet restart: the new pods compile and restore before their first step; disarm the stall timer.
      max_attempt_ = s.attempt;
      have_step_ = false;
    }
    s.terminated = s.phase == "Succeeded" || s.phase == "Failed";
    for (const auto& cs : p["status"].value("containerStatuses", json::array()))
      if (cs.value("name", "") == o_.container && cs.contains("state") && cs["state"].contains("terminated"))
        s.terminated = true;
  }

  void relist() {
    HttpResult r = c_.raw("GET", pods_path(o_.ns) + "?labelSelector=" + jobset_selector(o_.jobset));
    if (r.status < 200 || r.status >= 300) {
      if (r.status == 0) return;  // transient; try again next iteration
      throw KubeError(c_.explain(r, "GET", pods_path(o_.ns), "list pods of " + o_.jobset), r.status, "");
    }
    json l = json::parse(r.body);
    std::set<std::string> present;
    for (const auto& p : l.value("items", json::array())) {
      update_pod(p);
      present.insert(p["metadata"].value("name", ""));
    }
    for (auto& [n, s] : pods_)
      if (!present.count(n)) s.deleted = true;
    rv_ = l["metadata"].value("resourceVersion", "");
    need_relist_ = false;
    res_.relists++;
  }

  void start_pod_watch() {
    watching_ = true;
    std::string path =
        pods_path(o_.ns) + "?labelSelector=" + jobset_selector(o_.jobset) +
        "&watch=1&allowWatchBookmarks=true&timeoutSeconds=300&resourceVersion=" + url_escape(rv_);
    watch_id_ = streams_.start(
        path,
        [this](const std::string& line) {
          if (line.empty()) return;
          json ev;
          try {
            ev = json::parse(line);
          } catch (...) {
            return;
          }
          const std::string type = ev.value("type", "");
          const json& obj = ev.value("object", json::object());
          if (type == "ERROR") {
            // 410 Gone (resourceVersion too old) or another error inside a 200 stream: relist, re-watch.
            event("pod-watch-error", {{"status", obj}});
            need_relist_ = true;
            streams_.cancel(watch_id_);
            watching_ = false;
            return;
          }
          if (obj.contains("metadata")) rv_ = obj["metadata"].value("resourceVersion", rv_);
          if (type == "ADDED" || type == "MODIFIED") update_pod(obj);
          if (type == "DELETED") {
            update_pod(obj);
            pods_[obj["metadata"].value("name", "")].deleted = true;
          }
        },
        [this](long status, const std::string& body, const std::string& err) {
          watching_ = false;
          if (status == 401) {
            on_stream_unauthorized(body, pods_path(o_.ns) + "?watch=1", "watch pods of " + o_.jobset);
            need_relist_ = true;
          } else if (status == 410)
            need_relist_ = true;
          else if (status >= 400 && status != 410 && status != 500 && status != 503)
            throw KubeError(c_.explain(HttpResult{status, body, err, 0}, "GET", pods_path(o_.ns) + "?watch=1",
                                       "watch pods of " + o_.jobset),
                            status, "");
          else if (!err.empty() || status >= 500)
            need_relist_ = true;  // dropped: relist to catch what was missed
        });
  }

  // A watcher restarted on the same run directory continues each pod's saved log where it ended.
  void seed_from_file(const std::string& name, PodState& s) {
    std::ifstream f(o_.run_dir + "/logs/" + name + ".log", std::ios::binary);
    if (!f) return;
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekg(std::max<std::streamoff>(0, size - 65536));
    std::string line;
    while (std::getline(f, line)) {
      auto sp = line.find(' ');
      int64_t ts = sp == std::string::npos ? -1 : parse_rfc3339_ns(line.substr(0, sp));
      if (ts < 0) continue;
      if (ts != s.last_ts) s.at_last_ts.clear();
      s.last_ts = ts;
      s.at_last_ts.insert(line.substr(sp + 1));
    }
  }

  // 401 inside a stream: re-read the credentials (rotated token) and retry a few times before giving up.
  void on_stream_unauthorized(const std::string& body, const std::string& path, const std::string& what) {
    if (++auth_failures_ > 3)
      throw KubeError(c_.explain(HttpResult{401, body, "", 0}, "GET", path, what), 401, "Unauthorized");
    c_.auth_header(true);
  }

  void start_log_streams() {
    const int64_t now = now_ns();
    for (auto& [name, s] : pods_) {
      if (s.stream || s.log_done || s.deleted) continue;
      if (s.phase != "Running" && s.phase != "Succeeded" && s.phase != "Failed") continue;
      if (now < s.retry_at) continue;
      if (!s.file) {
        seed_from_file(name, s);
        s.file = std::make_unique<DurableLog>(o_.run_dir + "/logs/" + name + ".log");
      }
      std::string path = pods_path(o_.ns) + "/" + name + "/log?container=" + url_escape(o_.container) +
                         "&follow=true&timestamps=true";
      if (s.last_ts >= 0) {
        path +=
            "&sinceTime=" + url_escape(format_rfc3339(s.last_ts));  // whole seconds; duplicates dropped below
        res_.log_reconnects++;
      }
      const std::string pod = name;
      s.ever_connected = true;
      s.stream = streams_.start(
          path, [this, pod](const std::string& line) { on_log_line(pod, line); },
          [this, pod](long status, const std::string& body, const std::string& err) {
            on_log_done(pod, status, body, err);
          });
    }
  }

  void on_log_done(const std::string& pod, long status, const std::string& body, const std::string& err) {
    PodState& s = pods_[pod];
    s.stream = 0;
    const int64_t retry = static_cast<int64_t>(o_.retry_seconds * 1e9);
    if (status >= 200 && status < 300 && err.empty()) {
      if (s.terminated || s.deleted)
        s.log_done = true;
      else
        s.retry_at = now_ns() + retry;  // server closed a live follow (e.g. kubelet rotation): resume
      return;
    }
    if (!err.empty() && (status == 0 || (status >= 200 && status < 300))) {
      event("log-stream-dropped", {{"pod", pod}, {"error", err}});
      s.retry_at = now_ns() + retry;
      return;
    }
    if (status == 401) {
      on_stream_unauthorized(body, pods_path(o_.ns) + "/" + pod + "/log", "follow the log of pod " + pod);
      s.retry_at = now_ns() + retry;
      return;
    }
    if (status == 400) {  // container waiting to start
      s.retry_at = now_ns() + 2 * retry;
      return;
    }
    if (status == 404) {  // pod deleted: its log is gone
      s.deleted = true;
      s.log_done = true;
      return;
    }
    if (status >= 500) {
      s.retry_at = now_ns() + 2 * retry;
      return;
    }
    throw KubeError(c_.explain(HttpResult{status, body, err, 0}, "GET", pods_path(o_.ns) + "/" + pod + "/log",
                               "follow the log of pod " + pod),
                    status, "");
  }

  void on_log_line(const std::string& pod, const std::string& line) {
    PodState& s = pods_[pod];
    auth_failures_ = 0;
    auto sp = line.find(' ');
    int64_t ts = sp == std::string::npos ? -1 : parse_rfc3339_ns(line.substr(0, sp));
    std::string text = ts >= 0 ? line.substr(sp + 1) : line;
    if (ts >= 0) {
      if (ts < s.last_ts) return;  // already seen (sinceTime overlap)
      if (ts == s.last_ts) {
        if (s.at_last_ts.count(text)) return;
      } else {
        s.at_last_ts.clear();
        s.last_ts = ts;
      }
      s.at_last_ts.insert(text);
    }
    s.file->append(line + "\n", false);
    if (auto rbf = parse_required_rbf(text)) {
      last_rbf_ = rbf->value;
      if (rules_.max_required_rbf && !(rbf->value <= *rules_.max_required_rbf))
        fire("max_required_rbf: REQUIRED_RBF " + std::to_string(rbf->value) + " > " +
             std::to_string(*rules_.max_required_rbf) + " at step " + std::to_string(rbf->step) + " (pod " +
             pod + ")");
    }
    auto rec = parse_loss_parts(text);
    if (!rec) return;
    const int64_t step = (*rec)["step"];
    if (!seen_.insert({s.attempt, step}).second) return;
    (*rec)["pod"] = pod;
    (*rec)["restart_attempt"] = s.attempt;
    if (ts >= 0) (*rec)["time"] = format_rfc3339(ts, true);
    if (last_rbf_) (*rec)["required_rbf_latest"] = *last_rbf_;
    steps_->append(rec->dump() + "\n", true);  // fsync per record
    res_.records_written++;
    res_.last_step = std::max(res_.last_step, step);
    last_step_time_ = std::chrono::steady_clock::now();
    have_step_ = true;
    if (rules_.nan_loss) {
      for (const auto& [k, v] : rec->items()) {
        if (k == "pod" || k == "time" || k == "restart_attempt" || k == "step") continue;
        if (v.is_string()) {
          std::string t = v.get<std::string>();
          char* end = nullptr;
          double d = std::strtod(t.c_str(), &end);
          if (!t.empty() && *end == '\0' && !std::isfinite(d)) {
            fire("nan_loss: step " + std::to_string(step) + " " + k + "=" + t);
            break;
          }
        }
      }
    }
  }

  void check_stall() {
    if (!rules_.stall_minutes || !have_step_ || terminal_ || fired_) return;
    auto idle = std::chrono::steady_clock::now() - last_step_time_;
    if (idle > std::chrono::duration<double>(*rules_.stall_minutes * 60))
      fire("stall_minutes: no new step for " + std::to_string(*rules_.stall_minutes) + " min after step " +
           std::to_string(res_.last_step));
  }

  // A stop rule fired: record it durably, then deactivate the Workload. Exactly once: the record in stop.json
  // survives a watcher restart, and the patch is sent only while spec.active is still true.
  void fire(const std::string& reason) {
    if (fired_) return;
    fired_ = true;
    stop_reason_ = reason;
    res_.stop_fired = true;
    res_.stop_reason = reason;
    log_ << "stop rule fired: " << reason << "\n";
    io::write_file_atomic(o_.run_dir + "/stop.json", json{{"reason", reason},
                                                          {"step", res_.last_step},
                                                          {"time", format_rfc3339(now_ns(), true)},
                                                          {"workload_patched", false}}
                                                             .dump(2) +
                                                         "\n");
    event("stop-rule", {{"reason", reason}, {"step", res_.last_step}});
    patch_pending_ = true;
    try_patch();
  }

  void try_patch() {
    try {
      auto wl = find_workload(c_, o_.ns, uid_, kv_);
      if (!wl) return;  // Kueue has not created it yet; retry
      const std::string name = (*wl)["metadata"]["name"];
      bool patched = false;
      if ((*wl)["spec"].value("active", true)) {
        c_.merge_patch(workloads_path(o_.ns, kv_) + "/" + name, json{{"spec", {{"active", false}}}},
                       "deactivate Workload " + name);
        patched = true;
      }
      patch_pending_ = false;
      io::write_file_atomic(o_.run_dir + "/stop.json", json{{"reason", stop_reason_},
                                                            {"step", res_.last_step},
                                                            {"workload", name},
                                                            {"workload_patched", true},
                                                            {"time", format_rfc3339(now_ns(), true)}}
                                                               .dump(2) +
                                                           "\n");
      event("workload-deactivated", {{"workload", name}, {"sent_patch", patched}});
      log_ << "workload " << name << (patched ? " deactivated (spec.active=false)" : " was already inactive")
           << "\n";
    } catch (const KubeError& e) {
      if (e.status == 401 || e.status == 403) throw;
      log_ << "stop: will retry: " << e.what() << "\n";
    }
  }

  void refresh_run() {
    HttpResult r = c_.raw("GET", jobsets_path(o_.ns) + "/" + o_.jobset);
    if (r.status == 404) {
      if (!gone_) event("jobset-deleted", json::object());
      gone_ = true;
      return;
    }
    if (r.status < 200 || r.status >= 300) {
      if (r.status == 0 || r.status >= 500) return;
      throw KubeError(c_.explain(r, "GET", jobsets_path(o_.ns) + "/" + o_.jobset, "get JobSet " + o_.jobset),
                      r.status, "");
    }
    json js = json::parse(r.body);
    const std::string ts = js.value("status", json::object()).value("terminalState", "");
    if (!ts.empty() && !terminal_) event("jobset-terminal", {{"terminalState", ts}});
    terminal_ = !ts.empty();
    try {
      auto wl = find_workload(c_, o_.ns, uid_, kv_);
      if (wl) {
        bool active = (*wl)["spec"].value("active", true);
        if (!active && workload_active_)
          event("workload-inactive", {{"workload", (*wl)["metadata"]["name"]}});
        workload_active_ = active;
        bool evicted = cond_true(*wl, "Evicted");
        // Preempted / not admitted: no steps are expected; the stall timer re-arms at the next step.
        if (evicted || !cond_true(*wl, "Admitted")) have_step_ = false;
        if (evicted != evicted_)
          event(evicted ? "workload-evicted" : "workload-readmitted",
                {{"conditions", wl->value("status", json::object()).value("conditions", json::array())}});
        evicted_ = evicted;
      }
    } catch (const KubeError& e) {
      if (e.status == 401 || e.status == 403) throw;
    }
  }

  bool finished() {
    bool pods_done = true;
    for (auto& [n, s] : pods_)
      if (!(s.deleted || s.log_done) || s.stream) pods_done = false;
    if (gone_ && pods_done) {
      res_.end_reason = "JobSet deleted";
      return true;
    }
    if (terminal_ && pods_done) {
      res_.end_reason = "JobSet finished";
      return true;
    }
    if (!workload_active_ && pods_done) {
      res_.end_reason = "Workload deactivated and all pods gone";
      return true;
    }
    return false;
  }

  KubeClient& c_;
  const WatchOptions& o_;
  std::ostream& log_;
  StreamSet streams_;
  StopRules rules_;
  std::string uid_, kv_, rv_;
  std::map<std::string, PodState> pods_;
  std::set<std::pair<int, int64_t>> seen_;
  std::unique_ptr<DurableLog> steps_, events_;
  WatchResult res_;
  bool need_relist_ = true, watching_ = false;
  int watch_id_ = 0;
  bool fired_ = false, patch_pending_ = false;
  std::string stop_reason_;
  bool have_step_ = false;
  std::chrono::steady_clock::time_point last_step_time_{};
  std::optional<double> last_rbf_;
  bool terminal_ = false, gone_ = false, workload_active_ = true, evicted_ = false;
  int max_attempt_ = 0;
  int auth_failures_ = 0;
};

}  // namespace

WatchResult watch_run(KubeClient& c, const WatchOptions& opt, std::ostream& log) {
  OLMO_CHECK(!opt.run_dir.empty(), "watch: a run directory is required (--run-dir)");
  Watcher w(c, opt, log);
  return w.run();
}

}  // namespace olmosft::cluster
