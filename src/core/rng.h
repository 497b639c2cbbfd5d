// Counter-based RNG (Philox4x32-10, Salmon et al. 2011): the value at (seed, stream, index) is a pure
// function of those three numbers, so results are the same whatever the thread count or split.
#pragma once
#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace olmosft {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

struct Rng {
  uint64_t seed = 0;
  uint64_t stream = 0;  // e.g. a parameter's index, or a data epoch
  // 64 random bits at position i.
  uint64_t bits(uint64_t i) const;
  // Uniform in [0, 1) with 24 random bits (exact float).
  float uniform(uint64_t i) const;
  // Standard normal (Box-Muller on the two halves of one Philox block).
  float normal(uint64_t i) const;
  // Uniform integer in [0, n) (rejection-free multiply-shift; bias < 2^-32 for n < 2^32).
  uint64_t below(uint64_t i, uint64_t n) const;
};

// Fills an F32 tensor with N(mean, std) values; element k gets rng.normal(k).
void fill_normal(Tensor& t, const Rng& rng, float mean, float std);
void fill_uniform(Tensor& t, const Rng& rng, float lo, float hi);

}  // namespace olmosft
