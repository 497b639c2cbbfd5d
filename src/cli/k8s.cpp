// `olmosft k8s render|launch|status|stop|watch`: run a recipe on a Kubernetes cluster through JobSet and
// Kueue (see docs/k8s.md).
#include <filesystem>
#include <iostream>

#include "cli/verb.h"
#include "cluster/k8s_ops.h"
#include "cluster/manifest.h"
#include "cluster/recipe.h"

namespace {

using namespace olmosft::cluster;

struct ConnFlags {
  std::string kubeconfig, context, ns;
  void add(CLI::App& app) {
    app.add_option("--kubeconfig", kubeconfig,
                   "kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)");
    app.add_option("--context", context, "kubeconfig context (default: current-context)");
    app.add_option("-n,--namespace", ns, "namespace (default: the context's, else 'default')");
  }
  KubeConfig config() const { return resolve_config(kubeconfig, context, process_env()); }
  std::string namespace_of(const KubeConfig& c) const {
    if (!ns.empty()) return ns;
    return c.namespace_.empty() ? "default" : c.namespace_;
  }
};

void print_summary(const Recipe& r, const Rendered& out, std::ostream& os) {
  const auto& s = r.cluster.slice;
  os << "jobset " << out.jobset_name << " in namespace " << r.cluster.namespace_ << ", queue "
     << r.cluster.queue << "\n"
     << "  slice " << s.text << ": " << s.hosts << " pods x " << s.devices_per_host << " "
     << (s.kind == SliceSpec::Kind::Tpu ? "chips" : "GPUs") << " = " << s.devices() << " devices"
     << (s.gpu ? " (" + s.gpu->accelerator + ", " + std::to_string(s.gpu->memory_gb) + " GB each, " +
                     s.accelerator_key + "=" + s.accelerator_value + ")"
               : "")
     << (r.cluster.host_network ? ", hostNetwork" : "") << "\n"
     << "  batch: " << s.devices() << " devices x " << r.train.batch.per_device_batch << " = "
     << r.train.batch.slots << " rows per micro-step, gradient accumulation " << r.train.batch.grad_accum
     << ", global batch " << r.train.batch.global_batch << " rows x " << r.train.batch.seq_len
     << " tokens = " << r.train.batch.tokens_per_step << " tokens per step\n"
     << "  coordinator " << out.coordinator << ", termination grace " << r.train.checkpoint.grace_seconds
     << " s\n";
  for (const auto& w : out.warnings) os << w << "\n";
}

int render_main(int argc, char** argv) {
  CLI::App app{"Render a recipe into a JobSet + ConfigMaps (nothing is applied)", "k8s render"};
  std::vector<std::string> args;
  std::string out_dir, suffix;
  app.add_option("recipe", args, "RECIPE.yaml followed by key=value overrides")->required();
  app.add_option("--out", out_dir, "output directory for the manifests")->required();
  app.add_option("--suffix", suffix, "name suffix (default: a hash of the recipe and the time)");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    Recipe r = load_recipe(args[0], {args.begin() + 1, args.end()});
    Rendered out = render(r, {suffix});
    write_rendered(out, out_dir);
    print_summary(r, out, std::cout);
    std::cout << "wrote " << out.objects.size() << " manifests and manifest.json to " << out_dir << "\n";
    return 0;
  });
}

int launch_main(int argc, char** argv) {
  CLI::App app{"Create a run: render the recipe (or take a rendered directory) and create its objects",
               "k8s launch"};
  std::vector<std::string> args;
  std::string out_dir, suffix;
  bool dry = false;
  ConnFlags conn;
  app.add_option("recipe", args, "RECIPE.yaml [key=value ...], or a directory written by `k8s render`")
      ->required();
  app.add_option("--out", out_dir,
                 "where to keep the rendered manifests (default: k8s-runs/<jobset>/manifests)");
  app.add_option("--suffix", suffix, "name suffix (default: a hash of the recipe and the time)");
  app.add_flag("--dry-run", dry, "server-side dry run (dryRun=All): validates without creating");
  conn.add(app);
  return olmosft::cli::run_app(app, argc, argv, [&] {
    Rendered out;
    if (std::filesystem::is_directory(args[0])) {
      OLMO_CHECK(args.size() == 1,
                 "launch: overrides cannot be applied to an already rendered directory; "
                 "pass the recipe file instead");
      out = read_rendered(args[0]);
    } else {
      Recipe r = load_recipe(args[0], {args.begin() + 1, args.end()});
      out = render(r, {suffix});
      print_summary(r, out, std::cout);
      if (out_dir.empty()) out_dir = "k8s-runs/" + out.jobset_name + "/manifests";
      write_rendered(out, out_dir);
      std::cout << "manifests: " << out_dir << "\n";
    }
    KubeClient c(conn.config());
    LaunchResult lr = launch(c, out, dry, std::cout);
    std::cout << "next: olmosft k8s watch " << lr.jobset << " -n " << lr.ns << " --run-dir k8s-runs/"
              << lr.jobset << "\n      olmosft k8s status " << lr.jobset << " -n " << lr.ns << "\n";
    return 0;
  });
}

int status_main(int argc, char** argv) {
  CLI::App app{"Show a run: JobSet state and restarts, Kueue admission/eviction/preemption, pods",
               "k8s status"};
  std::string name;
  bool as_json = false;
  ConnFlags conn;
  app.add_option("jobset", name, "JobSet name")->required();
  app.add_flag("--json", as_json, "print JSON");
  conn.add(app);
  return olmosft::cli::run_app(app, argc, argv, [&] {
    KubeConfig cfg = conn.config();
    KubeClient c(cfg);
    auto st = run_status(c, conn.namespace_of(cfg), name);
    std::cout << (as_json ? st.dump(2) + "\n" : format_status(st));
    return 0;
  });
}

int stop_main(int argc, char** argv) {
  CLI::App app{
      "Stop a run by deactivating its Kueue Workload (spec.active=false); JobSet suspend is not used",
      "k8s stop"};
  std::string name;
  ConnFlags conn;
  app.add_option("jobset", name, "JobSet name")->required();
  conn.add(app);
  return olmosft::cli::run_app(app, argc, argv, [&] {
    KubeConfig cfg = conn.config();
    KubeClient c(cfg);
    StopResult r = stop_run(c, conn.namespace_of(cfg), name);
    std::cout << "workload " << r.workload
              << (r.patched ? ": deactivated (Kueue evicts the run and releases its quota)"
                            : ": already inactive")
              << "\n";
    return 0;
  });
}

int watch_main(int argc, char** argv) {
  CLI::App app{"Follow a run: every pod's log, every step's LOSS-PARTS record (durable), stop rules",
               "k8s watch"};
  std::string name, run_dir, recipe;
  WatchOptions o;
  ConnFlags conn;
  app.add_option("jobset", name, "JobSet name")->required();
  app.add_option("--run-dir", run_dir, "durable record directory (default: k8s-runs/<jobset>)");
  app.add_option("--recipe", recipe, "take stop rules from this recipe instead of the run's ConfigMap");
  app.add_option("--container", o.container, "container whose log to follow")->capture_default_str();
  app.add_option("--poll-seconds", o.poll_seconds, "JobSet/Workload refresh period")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--max-minutes", o.max_minutes, "stop watching after this long (0 = until the run ends)")
      ->capture_default_str();
  conn.add(app);
  return olmosft::cli::run_app(app, argc, argv, [&] {
    KubeConfig cfg = conn.config();
    KubeClient c(cfg);
    o.ns = conn.namespace_of(cfg);
    o.jobset = name;
    o.run_dir = run_dir.empty() ? "k8s-runs/" + name : run_dir;
    if (!recipe.empty()) o.rules = load_recipe(recipe, {}).cluster.stop_rules;
    WatchResult r = watch_run(c, o, std::cout);
    std::cout << "watch ended: " << r.end_reason << "; last step " << r.last_step << ", " << r.records_written
              << " new step records in " << o.run_dir << "/steps.jsonl"
              << (r.stop_fired ? "; stop rule fired: " + r.stop_reason : "") << "\n";
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB("k8s render", "render a recipe into JobSet + Kueue manifests (checks batch vs slice)",
             render_main);
OLMOSFT_VERB("k8s launch", "create a rendered run on the cluster (JobSet queued through Kueue)", launch_main);
OLMOSFT_VERB("k8s status", "show a run's JobSet, Kueue Workload (admission, preemption) and pods",
             status_main);
OLMOSFT_VERB("k8s stop", "stop a run: Workload spec.active=false (never JobSet suspend)", stop_main);
OLMOSFT_VERB("k8s watch", "follow a run's logs, record every step durably, apply stop rules", watch_main);
