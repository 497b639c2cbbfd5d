#include "train/perf.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <string>

#include "core/error.h"
#include "train/flops.h"

namespace olmosft::train {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double run_peak(dist::Comm& comm, const std::string& run_dir, double configured_tflops, std::ostream& out) {
  double peak = 0;
  std::string origin, error;
  if (comm.rank() == 0) {
    try {
      peak = run_peak_flops(run_dir, configured_tflops, &origin);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (!comm.all_ok(error.empty()))
    fail(error.empty() ? "the peak FLOP/s of the run could not be read on rank 0" : error);
  comm.broadcast(&peak, sizeof(peak), 0);
  out << "PREFLIGHT peak_flops=" << peak << (comm.size() > 1 ? " per process" : "") << " (" << origin
      << ") mfu=model FLOPs per step (train/flops.h, per document) / step time / (peak x processes)\n";
  return peak;
}

double proc_status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  const std::string k = std::string(key) + ":";
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return 1024.0 * std::atof(line.c_str() + k.size());
  return 0;
}

bool StepTimes::add(int64_t s, double step_time, std::ostream& err) {
  bool is_stalled = false;
  if (times_.size() >= 3 && step_time > 3.0 * median(times_)) {
    is_stalled = true;
    ++stalled_;
    err << "WARNING: step " << s << " stalled: " << step_time << " s vs running median " << median(times_)
        << " s\n";
  }
  times_.push_back(step_time);
  return is_stalled;
}

DistLine dist_facts(dist::Comm& comm, dist::ModelShards& shards, int64_t leaves_per_rank, double steps_run,
                    double rss) {
  const int world = comm.size();
  dist::ShardedParams& master = shards.params();
  const dist::MemoryStats ms = master.memory();
  double mine[4] = {static_cast<double>(comm.stats().total()) / steps_run,
                    static_cast<double>(ms.persistent_bytes), static_cast<double>(ms.peak_transient_bytes),
                    rss};
  std::vector<double> all(4 * static_cast<size_t>(world));
  comm.all_gather(mine, all.data(), 4);
  double P = 0, P_ends = 0;  // all parameters; those of the first and last unit (gathered once per leaf)
  for (const auto& t : master.specs()) {
    P += static_cast<double>(t.numel());
    if (t.unit == 0 || t.unit == master.units() - 1) P_ends += static_cast<double>(t.numel());
  }
  // Minimum bytes per rank per step, f = (N-1)/N x 4 bytes: dp: all-reduce = reduce-scatter + all-gather =
  // 2fP; zero3 reduce-scatters every leaf's gradient (docs/dist.md): whole-model f(P + leaves_per_rank x P),
  // per layer the forward and backward all-gathers of every leaf too: f x leaves_per_rank x (3P - P_ends).
  const double f = 4.0 * (world - 1) / world, lpr = static_cast<double>(leaves_per_rank);
  const double min_bytes = shards.mode() == dist::ShardMode::Replicated ? 2 * f * P
                           : shards.per_layer()                         ? f * lpr * (3 * P - P_ends)
                                                                        : f * (P + lpr * P);
  auto per_rank = [&](size_t k) {
    std::vector<double> v;
    for (size_t i = k; i < all.size(); i += 4) v.push_back(all[i]);
    return v;
  };
  const dist::ShardMode mode = shards.mode();
  DistLine dl;
  dl.mode = dist::mode_name(mode);
  dl.processes = world;
  dl.comm = comm.name();
  dl.gather = mode == dist::ShardMode::Replicated ? "none" : shards.per_layer() ? "per-layer" : "whole-model";
  dl.params = static_cast<int64_t>(P);
  dl.sent_bytes_per_step_per_rank = per_rank(0);
  dl.minimum_bytes = min_bytes;
  dl.persistent_bytes_per_rank = per_rank(1);
  dl.peak_transient_bytes_per_rank = per_rank(2);
  dl.rss_bytes_per_rank = per_rank(3);
  return dl;
}

}  // namespace olmosft::train
