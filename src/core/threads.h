// Threading: OpenMP for loops, OpenBLAS for GEMM; one setting (--threads / OLMOSFT_THREADS) drives both.
#pragma once
#include <cstdint>
#include <functional>

namespace olmosft {

// Sets the number of threads for OpenMP loops and OpenBLAS. n <= 0 means "all cores".
void set_threads(int n);
int num_threads();

// Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread (static schedule).
// While alive, OpenBLAS runs single-threaded (restored on destruction). For kernels that call small GEMMs
// inside their own OpenMP loops: a threaded OpenBLAS would spawn threads inside each OpenMP thread
// (measured 3x more CPU and 5x more wall time in the chunked KDA at H = 8, 2 threads). The setting is
// process-wide, so no other thread should call BLAS meanwhile.
class BlasSingleThread {
 public:
  BlasSingleThread();
  ~BlasSingleThread();
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;

 private:
  int prev_;
};

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_per_thread = 1);

}  // namespace olmosft
