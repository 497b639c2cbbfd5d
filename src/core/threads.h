// Threading: OpenMP for loops, OpenBLAS for GEMM; one setting (--threads / OLMOSFT_THREADS) drives both.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

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

// OpenMP threads wait passively (sleep) between parallel regions unless the user set OMP_WAIT_POLICY.
// libgomp reads the variable once, when it is loaded (before main), so when it is unset this sets it to
// "passive" and re-executes the program (/proc/self/exe, same argv) once; it returns when the variable was
// already set or the exec failed. Measured on the shared 2-core CI machine type (bench/RESULTS.md
// "Threads"): spinning threads made training steps 1.8-16x slower than passive ones. Call first in main.
void default_passive_omp_wait(char** argv);
// The OMP_WAIT_POLICY in effect ("unset" when none).
const char* omp_wait_policy();

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_per_thread = 1);

// One parallel region over many ranges: [0, sizes[i]) for each i, laid end to end, split into contiguous
// equal shares, one per thread; fn(i, begin, end) is called for each piece of range i in a thread's share
// (in order of i). For work spread over many tensors (a hybrid's optimizer step visits ~1,500): one
// parallel_for per tensor wakes the threads each time, measured at about 65-70 us per wake-up with passive
// waiting on this machine kind (bench/RESULTS.md "Optimizer, bf16 weights and PyTorch's bf16 autocast").
void parallel_for_ranges(const std::vector<int64_t>& sizes,
                         const std::function<void(size_t, int64_t, int64_t)>& fn, int64_t min_per_thread = 1);

}  // namespace olmosft
