#include "cluster/dist_env.h"

#include <cstdlib>

#include "core/error.h"

namespace olmosft::cluster {

EnvLookup process_env() {
  return [](const std::string& k) -> std::optional<std::string> {
    const char* v = std::getenv(k.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

EnvLookup map_env(std::map<std::string, std::string> m) {
  return [m = std::move(m)](const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

namespace {

int int_var(const EnvLookup& env, const std::string& name, int lo, int hi) {
  auto v = env(name);
  OLMO_CHECK(v.has_value(), "environment: ", name, " is not set");
  const std::string& s = *v;
  bool ok = !s.empty() && s.size() <= 9;
  for (char c : s) ok = ok && c >= '0' && c <= '9';
  OLMO_CHECK(ok, "environment: ", name, "='", s, "' is not a non-negative integer");
  int x = std::atoi(s.c_str());
  OLMO_CHECK(x >= lo && x <= hi, "environment: ", name, "=", x, " is out of range [", lo, ", ", hi, "]");
  return x;
}

int int_var_or(const EnvLookup& env, const std::string& name, int lo, int hi, int dflt) {
  auto v = env(name);
  if (!v.has_value() || v->empty()) return dflt;
  return int_var(env, name, lo, hi);
}

void check_rank(const DistEnv& d, const std::string& rank_var, const std::string& size_var) {
  OLMO_CHECK(d.world_size >= 1, "environment: ", size_var, " must be >= 1");
  OLMO_CHECK(d.rank < d.world_size, "environment: rank ", d.rank, " (", rank_var,
             ") is not below the world size ", d.world_size, " (", size_var, ")");
  OLMO_CHECK(d.local_rank < d.local_size, "environment: local rank ", d.local_rank,
             " is not below the local size ", d.local_size);
}

// Explicit coordinator (host:port) from OLMOSFT_COORDINATOR, or MASTER_ADDR/MASTER_PORT (torchrun style).
bool explicit_coordinator(const EnvLookup& env, DistEnv& d) {
  if (auto c = env("OLMOSFT_COORDINATOR"); c && !c->empty()) {
    auto colon = c->rfind(':');
    OLMO_CHECK(colon != std::string::npos && colon > 0, "environment: OLMOSFT_COORDINATOR='", *c,
               "' must be host:port");
    d.coordinator_host = c->substr(0, colon);
    d.coordinator_port = int_var(map_env({{"OLMOSFT_COORDINATOR port", c->substr(colon + 1)}}),
                                 "OLMOSFT_COORDINATOR port", 1, 65535);
    return true;
  }
  if (auto a = env("MASTER_ADDR"); a && !a->empty()) {
    d.coordinator_host = *a;
    d.coordinator_port = int_var_or(env, "MASTER_PORT", 1, 65535, 29500);
    return true;
  }
  return false;
}

}  // namespace

DistEnv detect_dist_env(const EnvLookup& env) {
  DistEnv d;
  constexpr int kMax = 1 << 20;
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) {
    d.source = "ompi";
    d.world_size = int_var(env, "OMPI_COMM_WORLD_SIZE", 1, kMax);
    d.rank = int_var(env, "OMPI_COMM_WORLD_RANK", 0, kMax);
    d.local_size = int_var_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMax, 1);
    d.local_rank = int_var_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, kMax, 0);
    check_rank(d, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
    explicit_coordinator(env, d);
    return d;
  }
  if (env("PMI_RANK") || env("PMI_SIZE")) {
    d.source = "pmi";
    d.world_size = int_var(env, "PMI_SIZE", 1, kMax);
    d.rank = int_var(env, "PMI_RANK", 0, kMax);
    d.local_rank = int_var_or(env, "MPI_LOCALRANKID", 0, kMax, 0);
    d.local_size = int_var_or(env, "MPI_LOCALNRANKS", 1, kMax, 1);
    check_rank(d, "PMI_RANK", "PMI_SIZE");
    explicit_coordinator(env, d);
    return d;
  }
  if (env("PMIX_RANK")) {
    d.source = "pmix";
    d.rank = int_var(env, "PMIX_RANK", 0, kMax);
    auto size = env("PMIX_SIZE") ? "PMIX_SIZE" : "OLMOSFT_WORLD_SIZE";
    OLMO_CHECK(env(size).has_value(),
               "environment: PMIX_RANK is set but the world size is not (PMIX_SIZE or "
               "OLMOSFT_WORLD_SIZE); PMIx exports no size variable by itself");
    d.world_size = int_var(env, size, 1, kMax);
    check_rank(d, "PMIX_RANK", size);
    explicit_coordinator(env, d);
    return d;
  }
  if (env("JOB_COMPLETION_INDEX")) {
    d.source = "jobset";
    OLMO_CHECK(env("OLMOSFT_NUM_PODS").has_value(),
               "environment: JOB_COMPLETION_INDEX is set but OLMOSFT_NUM_PODS is not; start the pod from the "
               "manifests of `olmosft k8s render` (its env ConfigMap sets it) or set it to the pod count");
    d.world_size = int_var(env, "OLMOSFT_NUM_PODS", 1, kMax);
    const int per_job = int_var_or(env, "OLMOSFT_PODS_PER_JOB", 1, kMax, d.world_size);
    const int idx = int_var(env, "JOB_COMPLETION_INDEX", 0, kMax);
    OLMO_CHECK(idx < per_job, "environment: JOB_COMPLETION_INDEX=", idx, " is not below the pods per job ",
               per_job, " (OLMOSFT_PODS_PER_JOB)");
    OLMO_CHECK(d.world_size % per_job == 0, "environment: OLMOSFT_NUM_PODS=", d.world_size,
               " is not a multiple of OLMOSFT_PODS_PER_JOB=", per_job);
    const int job_index = int_var_or(env, "JOB_INDEX", 0, kMax, 0);
    d.rank = job_index * per_job + idx;
    check_rank(d, "JOB_INDEX x OLMOSFT_PODS_PER_JOB + JOB_COMPLETION_INDEX", "OLMOSFT_NUM_PODS");
    d.restart_attempt = int_var_or(env, "RESTART_ATTEMPT", 0, kMax, 0);
    if (!explicit_coordinator(env, d)) {
      auto js = env("JOBSET_NAME");
      auto rj = env("REPLICATED_JOB_NAME");
      OLMO_CHECK(
          js && !js->empty() && rj && !rj->empty(),
          "environment: JOB_COMPLETION_INDEX is set but JOBSET_NAME / REPLICATED_JOB_NAME are not (the "
          "rendered pod template sets them from the jobset.sigs.k8s.io labels), and no OLMOSFT_COORDINATOR "
          "is given");
      auto sub = env("OLMOSFT_SUBDOMAIN");
      const std::string subdomain = sub && !sub->empty() ? *sub : *js;
      d.coordinator_host = *js + "-" + *rj + "-0-0." + subdomain;
      d.coordinator_port = int_var_or(env, "OLMOSFT_COORDINATOR_PORT", 1, 65535, 29500);
    }
    return d;
  }
  d.source = "single";
  explicit_coordinator(env, d);
  return d;
}

}  // namespace olmosft::cluster
