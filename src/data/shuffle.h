// Seeded permutations for the data build. Every permutation is a pure function of (seed, stream, n): a
// Fisher-Yates shuffle whose k-th swap index comes from the Philox counter RNG (core/rng.h) at index k, so
// the result does not depend on thread count, host count or platform.
#pragma once
#include <cstdint>
#include <vector>

namespace olmosft {

// Streams used by the data build (documented in docs/data.md).
inline uint64_t conversation_shuffle_stream(int epoch) { return 2 * static_cast<uint64_t>(epoch); }
inline uint64_t row_shuffle_stream(int epoch) { return 2 * static_cast<uint64_t>(epoch) + 1; }
inline uint64_t mix_subset_stream(uint64_t source_index) { return (uint64_t{1} << 40) + source_index; }

// A permutation of 0..n-1.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream);

}  // namespace olmosft
