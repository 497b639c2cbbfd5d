#include "data/shuffle.h"

#include <numeric>
#include <utility>

#include "core/rng.h"

namespace olmosft {

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  Rng rng{seed, stream};
  for (int64_t k = n - 1; k > 0; --k) {
    auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(k), static_cast<uint64_t>(k) + 1));
    std::swap(p[k], p[j]);
  }
  return p;
}

}  // namespace olmosft
