#include "core/bf16.h"

#include <cmath>

#include "core/threads.h"

namespace olmosft {

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    float v = std::ldexp(static_cast<float>(man), -24);  // subnormal
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (a < 0x38800000u) {                                               // subnormal or zero in half
    float v = bits_f32(a);
    // scale so that one half ulp (2^-24) becomes 1, then round to nearest even
    float scaled = v * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = ((a >> 23) - 112) << 10;
  uint32_t man = (a >> 13) & 0x3ffu;
  uint32_t rest = a & 0x1fffu;
  uint32_t h = exp | man;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
  return static_cast<uint16_t>(sign | h);
}

namespace {
// The element loops, vectorised (the `omp parallel for simd` form they replace ran the scalar loop:
// measured 22% of a bf16-compute hybrid training step). Same formulas, so the same bits.
void bf16_to_f32_span(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void f32_to_bf16_span(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
constexpr int64_t kPerThread = int64_t(1) << 19;  // threaded above 2^20 elements, as before
}  // namespace

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  parallel_for(
      static_cast<int64_t>(n), [&](int64_t b, int64_t e) { bf16_to_f32_span(src + b, dst + b, e - b); },
      kPerThread);
}

void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  parallel_for(
      static_cast<int64_t>(n), [&](int64_t b, int64_t e) { f32_to_bf16_span(src + b, dst + b, e - b); },
      kPerThread);
}

}  // namespace olmosft
