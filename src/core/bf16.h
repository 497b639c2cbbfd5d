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

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, keep sign and top payload
  }
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// IEEE half -> float (exact) and float -> half (round to nearest even), for fp16 checkpoints.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

void bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);

}  // namespace olmosft
