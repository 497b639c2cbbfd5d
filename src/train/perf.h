// Throughput facts of a run: the run's fp32 peak (FLOPs per step: train/flops.h), per-step timing (stall
// detection), the resident set size, and the DIST line's per-rank communication and memory figures.
#pragma once
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/model_shards.h"
#include "model/model.h"
#include "model/params.h"
#include "train/log_lines.h"

namespace olmosft::train {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0);
double median(std::vector<double> v);

// The run's peak FLOP/s per process (train/flops.h run_peak_flops: measured or configured on the first start,
// stored in RUN_DIR/peak_flops.json, read back on a resume), found on rank 0 and broadcast (collective);
// prints the PREFLIGHT peak_flops line. An error on rank 0 throws on every rank.
double run_peak(dist::Comm& comm, const std::string& run_dir, double configured_tflops, std::ostream& out);

// A memory figure of this process in bytes: the /proc/self/status line `key` (VmRSS, VmHWM, ...; its kB
// value); 0 when unavailable.
double proc_status_bytes(const char* key);
// Resident set size of this process in bytes (VmRSS; 0 when unavailable).
inline double rss_bytes() { return proc_status_bytes("VmRSS"); }

// Step times of a run and the steps that stalled (> 3x the running median of at least 3 earlier steps).
class StepTimes {
 public:
  // Records step s's time; true (and a WARNING on err) when it stalled.
  bool add(int64_t s, double step_time, std::ostream& err);
  int64_t stalled() const { return stalled_; }

 private:
  std::vector<double> times_;
  int64_t stalled_ = 0;
};

// The DIST line (collective: every rank calls it): bytes each rank sent per step against the all-reduce
// minimum, persistent and peak transient bytes per rank, and the RSS after the last update (`rss`).
DistLine dist_facts(dist::Comm& comm, dist::ModelShards& shards, int64_t leaves_per_rank, double steps_run,
                    double rss);

}  // namespace olmosft::train
