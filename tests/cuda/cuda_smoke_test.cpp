// CUDA smoke test (issue 13). Without a CUDA device it is skipped ("skipped: no CUDA device"), unless
// OLMOSFT_REQUIRE_CUDA_DEVICE=1 (scripts/gpu-check.sh sets it), which turns the skip into a failure so a
// GPU machine whose runtime cannot see its device does not pass silently. With a device, the kernel's bf16
// fma must match the CPU reference (core/bf16.h rounding, std::fma) bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "cuda/smoke.h"
#include "cuda_test_util.h"

namespace {

// Finite bf16 values from random bits (exponent 0xff, inf and NaN, excluded), plus the edge cases.
std::vector<uint16_t> finite_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x7f7f, 0xff7f};
  std::mt19937 rng(seed);
  while (v.size() < n) {
    const auto b = static_cast<uint16_t>(rng());
    if ((b & 0x7f80) != 0x7f80) v.push_back(b);
  }
  return v;
}

}  // namespace

TEST(Smoke, Bf16FmaMatchesCpuBitForBit) {
  OLMOSFT_SKIP_WITHOUT_CUDA_DEVICE();
  const size_t n = size_t{1} << 20;
  const auto x = finite_bf16(n, 1);
  const auto y = finite_bf16(n, 2);
  // 1: many exact ties (round to even); 0x1p-130f: fp32 subnormal products (a flush-to-zero build fails);
  // 0x1p100f: overflow to infinity.
  for (const float a : {1.0f, -0.75f, 0x1p-130f, 0x1p100f}) {
    const std::vector<uint16_t> got = olmosft::cuda::bf16_fma(a, x, y);
    ASSERT_EQ(got.size(), n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want =
          olmosft::f32_to_bf16(std::fma(a, olmosft::bf16_to_f32(x[i]), olmosft::bf16_to_f32(y[i])));
      if (got[i] != want && ++bad <= 5) {
        ADD_FAILURE() << "a=" << a << " i=" << i << " x=0x" << std::hex << x[i] << " y=0x" << y[i]
                      << ": device 0x" << got[i] << ", CPU 0x" << want << std::dec;
      }
    }
    EXPECT_EQ(bad, 0u) << "mismatches for a=" << a << " out of " << n;
  }
}

// Runs without a device too: the size check comes before any CUDA call (and the library links and loads).
TEST(Smoke, RejectsMismatchedSizes) {
  const std::vector<uint16_t> x(3), y(4);
  EXPECT_THROW(olmosft::cuda::bf16_fma(1.0f, x, y), std::invalid_argument);
}
