// Helpers shared by the benchmarks (each bench/*.cpp is its own executable, so they are header-only).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <utility>

namespace olmosft::bench {

// Wall-clock seconds (steady clock).
inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds used by the whole process (all threads). On a shared, loaded machine wall time includes time
// spent descheduled; with one thread the CPU time is the time the kernel actually ran.
inline double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Runs f() reps + 1 times (the first is a warm-up) and returns the best {wall, cpu} seconds of the rest.
template <typename F>
std::pair<double, double> best_of(int reps, F&& f) {
  double bw = 1e30, bc = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = now(), c0 = cpu_now();
    f();
    const double dw = now() - t0, dc = cpu_now() - c0;
    if (r > 0) {
      bw = std::min(bw, dw);
      bc = std::min(bc, dc);
    }
  }
  return {bw, bc};
}

// Visible (query, key) pairs of one causal document of length L with sliding window W (0 = full causal):
// the FLOP count of one L x L attention matmul is 2 * pairs * head_dim.
inline double causal_pairs(int64_t L, int64_t W) {
  double p = 0;
  for (int64_t i = 0; i < L; ++i) p += double(W > 0 ? std::min<int64_t>(i + 1, W) : i + 1);
  return p;
}

}  // namespace olmosft::bench
