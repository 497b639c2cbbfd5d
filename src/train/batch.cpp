#include "train/batch.h"

#include <algorithm>

#include "core/error.h"

namespace olmosft::train {

// ---- data order ---------------------------------------------------------------------------------------

DataOrder::DataOrder(std::vector<int64_t> rows_per_epoch, int64_t global_batch)
    : rows_(std::move(rows_per_epoch)), global_batch_(global_batch) {
  OLMO_CHECK(global_batch_ >= 1, "DataOrder: global_batch must be >= 1");
  for (int64_t r : rows_) {
    OLMO_CHECK(r >= 0, "DataOrder: negative row count");
    start_.push_back(total_);
    total_ += r;
  }
}

RowRef DataOrder::locate(int64_t g) const {
  OLMO_CHECK(g >= 0 && g < total_, "data order: global row ", g, " is outside the ", total_,
             " rows of the usable epochs");
  // The last epoch whose first global row is <= g and that has rows.
  size_t e = static_cast<size_t>(std::upper_bound(start_.begin(), start_.end(), g) - start_.begin()) - 1;
  while (rows_[e] == 0 || g - start_[e] >= rows_[e]) ++e;
  return RowRef{static_cast<int>(e), g - start_[e]};
}

std::vector<RowRef> DataOrder::step_rows(int64_t step, int rank, int world) const {
  OLMO_CHECK(step >= 1, "data order: steps are 1-based, got ", step);
  OLMO_CHECK(world >= 1 && rank >= 0 && rank < world, "data order: bad rank ", rank, " of ", world);
  OLMO_CHECK(global_batch_ % world == 0, "data order: global_batch=", global_batch_,
             " is not divisible by the number of processes ", world);
  int64_t per = global_batch_ / world;
  std::vector<RowRef> out;
  out.reserve(static_cast<size_t>(per));
  for (int64_t r = rank * per; r < (rank + 1) * per; ++r)
    out.push_back(locate((step - 1) * global_batch_ + r));
  return out;
}

model::Batch batch_view(int64_t B, int64_t T, const std::vector<int32_t>& tokens,
                        const std::vector<int32_t>& segments, const std::vector<int32_t>& positions,
                        const std::vector<int32_t>& targets, const std::vector<uint8_t>& trained) {
  const size_t n = static_cast<size_t>(B * T);
  OLMO_CHECK(tokens.size() == n && segments.size() == n && positions.size() == n && targets.size() == n &&
                 trained.size() == n,
             "batch_view: arrays must hold B x T = ", n, " entries");
  model::Batch b;
  b.B = B;
  b.T = T;
  b.tokens = tokens.data();
  b.segments = segments.data();
  b.positions = positions.data();
  b.targets = targets.data();
  b.trained = trained.data();
  return b;
}

model::Batch HostBatch::view() const {
  return batch_view(B, T, tokens, segments, positions, targets, trained);
}

HostBatch make_batch(const PackedDataset& ds, const std::vector<RowRef>& rows) {
  HostBatch b;
  b.B = static_cast<int64_t>(rows.size());
  b.T = ds.seq_len();
  size_t n = static_cast<size_t>(b.B * b.T);
  b.tokens.resize(n);
  b.segments.resize(n);
  b.positions.resize(n);
  b.targets.resize(n);
  b.trained.resize(n);
  for (int64_t i = 0; i < b.B; ++i) {
    PackedRow pr = ds.row(rows[i].epoch, rows[i].index);
    size_t o = static_cast<size_t>(i * b.T);
    std::copy(pr.tokens, pr.tokens + b.T, b.tokens.begin() + o);
    for (int64_t t = 0; t < b.T; ++t) b.segments[o + t] = pr.segment_ids[t] == 0 ? -1 : pr.segment_ids[t];
    pr.positions(b.positions.data() + o);
    pr.targets(b.targets.data() + o, -100);
    for (int64_t t = 0; t < b.T; ++t) {
      b.trained[o + t] = b.targets[o + t] != -100 ? 1 : 0;
      b.trained_count += b.trained[o + t];
    }
  }
  return b;
}

}  // namespace olmosft::train
