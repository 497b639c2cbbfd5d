// bfloat16 and float16 <-> float32 conversions. fp32 -> bf16 rounds to nearest, ties to even; NaN stays
// a (quiet) NaN; +-inf and signed zeros are preserved. bf16 -> fp32 is exact.
#pragma once
#include <cstdint>
#include <cstring>

namespace olmosft {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Branch-free (a select, not a jump), so loops over it vectorise (`#pragma omp simd`).
inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t nan = (u >> 16) | 0x0040u;                         // quiet NaN, keep sign and top payload
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest, ties to even
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// IEEE half -> float (exact) and float -> half (round to nearest even), for fp16 checkpoints.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

void bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);

}  // namespace olmosft
