#include "core/rng.h"

#include <cmath>

namespace olmosft {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(M0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(M1) * c[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += W0;
    k[1] += W1;
  }
  return c;
}

static std::array<uint32_t, 4> block(const Rng& r, uint64_t i) {
  return philox4x32({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32),
                     static_cast<uint32_t>(r.stream), static_cast<uint32_t>(r.stream >> 32)},
                    {static_cast<uint32_t>(r.seed), static_cast<uint32_t>(r.seed >> 32)});
}

uint64_t Rng::bits(uint64_t i) const {
  auto b = block(*this, i);
  return (static_cast<uint64_t>(b[0]) << 32) | b[1];
}

float Rng::uniform(uint64_t i) const { return static_cast<float>(block(*this, i)[0] >> 8) * 0x1.0p-24f; }

float Rng::normal(uint64_t i) const {
  auto b = block(*this, i);
  // u1 in (0, 1], u2 in [0, 1): 53-bit doubles from two words each.
  double u1 = (static_cast<double>((static_cast<uint64_t>(b[0]) << 21) ^ (b[1] >> 11)) + 1.0) * 0x1.0p-53;
  double u2 = static_cast<double>((static_cast<uint64_t>(b[2]) << 21) ^ (b[3] >> 11)) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

uint64_t Rng::below(uint64_t i, uint64_t n) const {
  auto b = block(*this, i);
  uint64_t x = (static_cast<uint64_t>(b[0]) << 32) | b[1];
  return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
}

void fill_normal(Tensor& t, const Rng& rng, float mean, float std) {
  OLMO_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), "fill_normal: needs a contiguous F32 tensor");
  float* p = t.data<float>();
  int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t k = 0; k < n; ++k) p[k] = mean + std * rng.normal(static_cast<uint64_t>(k));
}

void fill_uniform(Tensor& t, const Rng& rng, float lo, float hi) {
  OLMO_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), "fill_uniform: needs a contiguous F32 tensor");
  float* p = t.data<float>();
  int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t k = 0; k < n; ++k) p[k] = lo + (hi - lo) * rng.uniform(static_cast<uint64_t>(k));
}

}  // namespace olmosft
