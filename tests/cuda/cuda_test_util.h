// Shared helpers of the CUDA kernel tests (tests/cuda/*_test.cpp). Without a CUDA device every device test
// is skipped with "skipped: no CUDA device (...)"; OLMOSFT_REQUIRE_CUDA_DEVICE=1 (scripts/gpu-check.sh) turns
// the skip into a failure. The references are plain float64 loops written in the tests: the CPU kernels
// (src/kernels/*.cpp) need OpenMP and OpenBLAS, which the GPU machine's standalone build does not have.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cuda/smoke.h"

namespace olmosft::cuda::test {

// True when a CUDA device is visible (and prints it once); else *why says what the runtime answered, and when
// OLMOSFT_REQUIRE_CUDA_DEVICE=1 the current test has failed.
inline bool have_device(std::string* why) {
  static int printed = 0;
  const int n = device_count(why);
  if (n > 0) {
    if (!printed++) std::printf("CUDA device 0 of %d: %s\n", n, describe_device(0).c_str());
    return true;
  }
  const char* req = std::getenv("OLMOSFT_REQUIRE_CUDA_DEVICE");
  if (req && std::string(req) == "1")
    ADD_FAILURE() << "OLMOSFT_REQUIRE_CUDA_DEVICE=1 but no CUDA device: " << *why;
  return false;
}

#define OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE()                        \
  do {                                                            \
    std::string why_;                                             \
    if (!::olmosft::cuda::test::have_device(&why_))               \
      GTEST_SKIP() << "skipped: no CUDA device (" << why_ << ")"; \
  } while (0)

// n bf16 values, normal with standard deviation sd (rounded to bf16), as bit patterns.
inline std::vector<uint16_t> random_bf16(size_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(dist(rng));
  return v;
}
inline std::vector<float> random_f32(size_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
inline double bf(uint16_t h) { return double(bf16_to_f32(h)); }

// Unit roundoff of fp32 and the worst-case relative error bound of an n-term fp32 sum (Higham's gamma_n,
// to first order n * u), used as: |computed - exact| <= gamma(n) * sum |terms|.
constexpr double kU32 = 0x1p-24;
inline double gamma32(int64_t n) { return double(n) * kU32; }
// Half an ulp of bf16 relative (2^-9) doubled for margin: a bf16 output of a value computed with small fp32
// error lies within 2^-8 |exact| of it.
constexpr double kBf16Rel = 0x1p-8;

// Counts elements with |got - want| > tol[i], reporting the first few with `what`.
inline int64_t count_bad(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                         const std::vector<double>& tol) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol[i])) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: device " << got[i] << ", reference " << want[i]
                      << ", |diff| " << std::fabs(got[i] - want[i]) << " > tolerance " << tol[i];
    }
  }
  return bad;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline std::vector<double> widen(const std::vector<uint16_t>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf(v[i]);
  return r;
}
inline std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace olmosft::cuda::test
