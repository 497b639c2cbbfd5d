// Throughput facts of a run: model FLOPs per step (for MFU), the fp32 peak, per-step timing (stall
// detection), the resident set size, and the DIST line's per-rank communication and memory figures.
// (A finer FLOP count is planned in train/flops.h; this is the convention the logs have used so far.)
#pragma once
#include <chrono>
#include <cstdint>
#include <iosfwd>
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

// Model FLOPs (forward + backward), counted as the implementation does the work:
//   per token:          6 x N_body + attention (12 x heads x head_dim x ctx per layer; ctx = T/2 for full
//                       causal layers, min(window, T/2) for sliding ones; KDA/linear layers not counted)
//   per trained target: 6 x vocab x hidden for the LM head (the tiled cross-entropy skips untrained tokens)
// N_body = active parameters less the embedding (a lookup, no FLOPs) and the LM head.
struct ModelFlops {
  double per_token = 0, per_trained = 0;
  double step(double tokens, double trained) const { return per_token * tokens + per_trained * trained; }
};
// n_active: the parameters a token uses (dense: all; MoE: model::count_params(c).active).
ModelFlops model_flops(const model::ModelConfig& c, double n_active, int64_t T);
// The trainer's: n_active = the model's parameters (MoE: count_params(c).active where it can count them).
ModelFlops model_flops(const model::CausalLM& m, const std::vector<model::Param>& params, int64_t T);

// Measured fp32 peak of this process: the best of `reps` 1024^3 SGEMMs (OpenBLAS, all threads).
double measure_peak_flops(int reps = 3);

// Resident set size of this process in bytes (VmRSS of /proc/self/status; 0 when unavailable).
double rss_bytes();

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
