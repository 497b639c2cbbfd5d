// Threading: OpenMP for loops, OpenBLAS for GEMM; one setting (--threads / OLMOSFT_THREADS) drives both.
#pragma once
#include <cstdint>
#include <functional>

namespace olmosft {

// Sets the number of threads for OpenMP loops and OpenBLAS. n <= 0 means "all cores".
void set_threads(int n);
int num_threads();

// Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread (static schedule).
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_per_thread = 1);

}  // namespace olmosft
