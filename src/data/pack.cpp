#include "data/pack.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "core/error.h"

namespace olmosft {

namespace {
void check_items(const std::vector<int32_t>& lengths, int64_t capacity) {
  OLMO_CHECK(capacity > 0, "packing: row capacity must be positive, got ", capacity);
  for (size_t i = 0; i < lengths.size(); ++i) {
    OLMO_CHECK(lengths[i] >= 1 && lengths[i] <= capacity, "packing: item ", i, " has length ", lengths[i],
               ", expected 1..", capacity);
  }
}
}  // namespace

Bins pack_first_fit(const std::vector<int32_t>& lengths, int64_t capacity) {
  check_items(lengths, capacity);
  const int64_t n = static_cast<int64_t>(lengths.size());
  int64_t size = 1;
  while (size < std::max<int64_t>(n, 1)) size *= 2;
  // tree[1] is the root; leaves size..2*size-1 hold the free room of row (leaf - size). Unopened rows are
  // empty, so the leftmost row with room is either an open row or the next row to open.
  std::vector<int64_t> tree(2 * size, capacity);
  Bins bins;
  for (int64_t i = 0; i < n; ++i) {
    int64_t need = lengths[i];
    int64_t node = 1;
    while (node < size) node = tree[2 * node] >= need ? 2 * node : 2 * node + 1;
    int64_t row = node - size;
    if (row >= static_cast<int64_t>(bins.size())) bins.emplace_back();
    bins[row].push_back(i);
    tree[node] -= need;
    for (node /= 2; node >= 1; node /= 2) tree[node] = std::max(tree[2 * node], tree[2 * node + 1]);
  }
  return bins;
}

Bins pack_best_fit_decreasing(const std::vector<int32_t>& lengths, int64_t capacity) {
  check_items(lengths, capacity);
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::set<std::pair<int64_t, int64_t>> room;  // (free room, row)
  Bins bins;
  for (int64_t i : order) {
    auto it = room.lower_bound({lengths[i], -1});
    int64_t row, free;
    if (it == room.end()) {
      row = static_cast<int64_t>(bins.size());
      bins.emplace_back();
      free = capacity;
    } else {
      row = it->second;
      free = it->first;
      room.erase(it);
    }
    bins[row].push_back(i);
    free -= lengths[i];
    if (free > 0) room.insert({free, row});
  }
  return bins;
}

double padding_fraction(const std::vector<int32_t>& lengths, int64_t rows_count, int64_t capacity) {
  if (rows_count == 0) return 0.0;
  int64_t used = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  return 1.0 - static_cast<double>(used) / (static_cast<double>(rows_count) * static_cast<double>(capacity));
}

}  // namespace olmosft
