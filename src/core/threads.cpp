#include "core/threads.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace olmosft {

void set_threads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

void default_passive_omp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  // The binary's own path, not /proc/self/exe: the process name (comm, what ps and pgrep show) is taken
  // from the path executed.
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0 || n >= static_cast<ssize_t>(sizeof(self) - 1)) return;
  self[n] = '\0';
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv(self, argv);  // returns only on failure: carry on with libgomp's default
}

const char* omp_wait_policy() {
  const char* p = std::getenv("OMP_WAIT_POLICY");
  return p != nullptr ? p : "unset";
}

BlasSingleThread::BlasSingleThread() : prev_(openblas_get_num_threads()) {
  if (prev_ != 1) openblas_set_num_threads(1);
}
BlasSingleThread::~BlasSingleThread() {
  if (prev_ != 1) openblas_set_num_threads(prev_);
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_per_thread) {
  if (n <= 0) return;
  int64_t nt =
      std::min<int64_t>(num_threads(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread)));
  if (nt <= 1) {
    fn(0, n);
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(nt))
  {
    int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t b = n * t / T, e = n * (t + 1) / T;
    if (b < e) fn(b, e);
  }
}

void parallel_for_ranges(const std::vector<int64_t>& sizes,
                         const std::function<void(size_t, int64_t, int64_t)>& fn, int64_t min_per_thread) {
  std::vector<int64_t> start(sizes.size() + 1, 0);  // start[i]: offset of range i in the concatenation
  for (size_t i = 0; i < sizes.size(); ++i) start[i + 1] = start[i] + std::max<int64_t>(0, sizes[i]);
  const int64_t total = start.back();
  auto run = [&](int64_t b, int64_t e) {  // the pieces of [b, e) of the concatenation
    size_t i = size_t(std::upper_bound(start.begin(), start.end(), b) - start.begin()) - 1;
    for (; i < sizes.size() && start[i] < e; ++i) {
      const int64_t lo = std::max(b, start[i]), hi = std::min(e, start[i + 1]);
      if (lo < hi) fn(i, lo - start[i], hi - start[i]);
    }
  };
  parallel_for(total, run, min_per_thread);
}

}  // namespace olmosft
