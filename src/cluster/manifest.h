// Renders a recipe into Kubernetes objects: a JobSet (jobset.x-k8s.io/v1alpha2) queued through Kueue, a
// ConfigMap holding the recipe itself, and a ConfigMap with the launcher environment. The JobSet's
// network section makes the JobSet controller create the headless Service (named after the subdomain)
// that gives every pod the DNS name <jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain>.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cluster/recipe.h"

namespace olmosft::cluster {

using OJson = nlohmann::ordered_json;

struct RenderOptions {
  // Name suffix (lowercase hex / digits, 1..8 chars). Empty: derived from a hash of the effective recipe
  // and the current time, so two launches of the same recipe get different names.
  std::string suffix;
};

struct Rendered {
  std::string jobset_name;
  std::string replicated_job;  // "slice" (TPU) or "node" (GPU)
  std::string subdomain;
  std::string coordinator;  // host:port of pod 0
  // accelerator_warnings(): what this build's pods would really do (printed; a JobSet annotation). Not kept
  // in manifest.json (the annotation is).
  std::vector<std::string> warnings;
  // (file name, object) in apply order: ConfigMaps first, then the JobSet.
  std::vector<std::pair<std::string, OJson>> objects;
};

// DNS-1035 label from a free-form run name, with "-<suffix>" appended, short enough that the longest
// pod hostname <name>-<rjob>-<jobIdx>-<podIdx> stays within 63 characters.
std::string make_jobset_name(const std::string& run_name, const std::string& suffix, const std::string& rjob,
                             int replicas, int pods_per_job);
bool is_dns1035_label(const std::string& s);

// Throws what accelerator_warnings() refuses (this build cannot use the slice's accelerators).
Rendered render(const Recipe& r, const RenderOptions& opt = {});

// YAML text of one object (strings that would re-parse as numbers/bools are quoted; multi-line strings are
// literal blocks).
std::string to_yaml(const OJson& obj);

// Writes <dir>/<file>.yaml for each object plus <dir>/manifest.json (all objects, apply order), atomically.
void write_rendered(const Rendered& out, const std::string& dir);
// Reads <dir>/manifest.json back.
Rendered read_rendered(const std::string& dir);

}  // namespace olmosft::cluster
