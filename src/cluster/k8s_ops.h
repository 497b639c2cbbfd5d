// Run operations over the Kubernetes API: launch a rendered run, show its status, stop it through Kueue
// (Workload.spec.active=false, never JobSet.spec.suspend, which Kueue reverts while it has the run admitted),
// and watch it: follow every pod's log from its start (resuming with sinceTime after a dropped stream),
// keep every step's LOSS-PARTS record in a durable run directory, and apply the recipe's stop rules.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "cluster/kube_client.h"
#include "cluster/manifest.h"
#include "cluster/recipe.h"
#include "train/log_lines.h"

namespace olmosft::cluster {

std::string jobsets_path(const std::string& ns);
std::string workloads_path(const std::string& ns, const std::string& kueue_version);
std::string pods_path(const std::string& ns);

// Kueue's preferred API version from discovery (GET /apis/kueue.x-k8s.io); a clear error if Kueue is absent.
std::string kueue_version(KubeClient& c);
// The Workload Kueue made for a JobSet, by label kueue.x-k8s.io/job-uid=<JobSet uid> (its name has a hash
// suffix that is not worth recomputing). nullopt if Kueue has not created it (yet).
std::optional<nlohmann::json> find_workload(KubeClient& c, const std::string& ns,
                                            const std::string& jobset_uid, const std::string& kueue_version);

struct LaunchResult {
  std::string jobset, uid, ns;
};
LaunchResult launch(KubeClient& c, const Rendered& r, bool server_dry_run, std::ostream& log);

struct StopResult {
  std::string workload;
  bool patched = false;           // this call sent the patch
  bool already_inactive = false;  // spec.active was already false
};
// Deactivates the run's Workload (merge patch {"spec":{"active":false}}). Idempotent.
StopResult stop_run(KubeClient& c, const std::string& ns, const std::string& jobset);

// JobSet + Workload + pods summary (admission, restarts, preemption/eviction conditions).
nlohmann::json run_status(KubeClient& c, const std::string& ns, const std::string& jobset);
std::string format_status(const nlohmann::json& st);

// A trainer LOSS-PARTS line (train/log_lines.h) as a steps.jsonl record: step, each loss term
// (model/loss_terms.h: ce, lm_z, moe_lb, router_z), tokens; non-finite values as text ("nan"). nullopt if the
// text holds no well-formed LOSS-PARTS line.
std::optional<nlohmann::json> parse_loss_parts(const std::string& text);
// A trainer "REQUIRED_RBF step=N value=X" line (train/log_lines.h), if the text holds one.
std::optional<train::RequiredRbfLine> parse_required_rbf(const std::string& text);

struct WatchOptions {
  std::string ns, jobset;
  std::string run_dir;             // durable records: steps.jsonl, events.jsonl, stop.json, logs/<pod>.log
  std::optional<StopRules> rules;  // nullopt: read from the run's recipe ConfigMap (<jobset>-recipe)
  std::string container = "trainer";
  double poll_seconds = 10;  // JobSet / Workload refresh and stall check period
  double max_minutes = 0;    // 0: until the run ends
  long max_iterations = 0;   // 0: unbounded (tests bound the loop)
  double retry_seconds = 1;  // before reconnecting a dropped log stream
};

struct WatchResult {
  int64_t last_step = 0;
  int records_written = 0;  // new step records this session
  int log_reconnects = 0;   // log streams resumed with sinceTime
  int relists = 0;          // pod relists (initial one included)
  bool stop_fired = false;  // a stop rule fired in this session (and the Workload was deactivated)
  std::string stop_reason;
  std::string end_reason;  // why the watch ended
};

WatchResult watch_run(KubeClient& c, const WatchOptions& opt, std::ostream& log);

}  // namespace olmosft::cluster
