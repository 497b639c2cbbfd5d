// Where this process sits in a multi-host run, from the environment alone (no ssh, no hostfile):
//   - mpirun (OpenMPI: OMPI_COMM_WORLD_*; MPICH/Hydra and PMIx: PMI_RANK/PMI_SIZE, PMIX_RANK),
//   - a JobSet pod (JOB_COMPLETION_INDEX from the Job controller; the pod count, JobSet name,
//     replicated job and subdomain from the env ConfigMap and downward API that `olmosft k8s render` writes),
//   - otherwise a single process (rank 0 of 1).
// The coordinator of a JobSet run is pod 0's stable DNS name <jobset>-<rjob>-0-0.<subdomain>:<port>.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace olmosft::cluster {

struct DistEnv {
  std::string source;  // "ompi", "pmi", "pmix", "jobset" or "single"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string coordinator_host;  // empty when the launcher (MPI) does the bootstrap itself
  int coordinator_port = 0;
  int restart_attempt = 0;  // JobSet restart generation (0 outside JobSet)
  std::string coordinator() const {
    return coordinator_host.empty() ? "" : coordinator_host + ":" + std::to_string(coordinator_port);
  }
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Reads the process environment (getenv).
EnvLookup process_env();
// A fixed map (tests).
EnvLookup map_env(std::map<std::string, std::string> m);

// Throws olmosft::Error naming the variable when a value is malformed or inconsistent (rank >= size...).
DistEnv detect_dist_env(const EnvLookup& env);

}  // namespace olmosft::cluster
