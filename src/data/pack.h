// Bin packing of conversations into fixed-length rows. Every item must be 1..capacity long.
//   first-fit (stream order): each item goes to the lowest-numbered row with room, over ALL rows opened so
//   far
//     (an unbounded window; O(n log n) with a max segment tree). Rows are numbered in opening order.
//   best-fit decreasing: items by decreasing length (ties: stream order) into the row with the least room
//   that fits
//     (ties: lowest row). Used for the comparison figure in the manifest, or as the packing with --packing
//     bfd.
// Within a row, items keep their insertion order (segment ids 1, 2, ... follow it).
#pragma once
#include <cstdint>
#include <vector>

namespace olmosft {

using Bins = std::vector<std::vector<int64_t>>;  // per row: indices into the lengths vector

Bins pack_first_fit(const std::vector<int32_t>& lengths, int64_t capacity);
Bins pack_best_fit_decreasing(const std::vector<int32_t>& lengths, int64_t capacity);
// Fraction of padding tokens when the items fill rows_count rows of capacity tokens.
double padding_fraction(const std::vector<int32_t>& lengths, int64_t rows_count, int64_t capacity);

}  // namespace olmosft
