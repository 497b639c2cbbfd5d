// The trainer's data side: which packed rows make each step (DataOrder, a pure function of the step and the
// process count) and the micro-batches materialised from them (HostBatch), plus batch_view(), the one place
// that points a model::Batch at owning arrays (the trainer, `olmosft forward` and greedy generation).
#pragma once
#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "model/model.h"

namespace olmosft::train {

// Which rows make step s (1-based): global row g = (s-1) * global_batch + r, r in [0, global_batch).
// Rank p of P processes takes rows r in [p * global_batch / P, (p+1) * global_batch / P).
struct RowRef {
  int epoch = 0;
  int64_t index = 0;
};
class DataOrder {
 public:
  // rows_per_epoch[e] = rows of epoch e usable by the run (epochs in order).
  DataOrder(std::vector<int64_t> rows_per_epoch, int64_t global_batch);
  int64_t total_rows() const { return total_; }
  int64_t max_steps() const { return total_ / global_batch_; }  // whole steps the epochs hold
  RowRef locate(int64_t g) const;                               // g in [0, total_rows())
  std::vector<RowRef> step_rows(int64_t step, int rank = 0, int world = 1) const;

 private:
  std::vector<int64_t> rows_, start_;
  int64_t total_ = 0, global_batch_ = 0;
};

// One micro-batch materialised from packed rows (owning arrays; Batch points into them).
struct HostBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, segments, positions, targets;
  std::vector<uint8_t> trained;
  int64_t trained_count = 0;  // positions with a training target
  model::Batch view() const;
};
// A model::Batch of B rows of T positions viewing the arrays (each B x T; they must outlive the view).
model::Batch batch_view(int64_t B, int64_t T, const std::vector<int32_t>& tokens,
                        const std::vector<int32_t>& segments, const std::vector<int32_t>& positions,
                        const std::vector<int32_t>& targets, const std::vector<uint8_t>& trained);
HostBatch make_batch(const PackedDataset& ds, const std::vector<RowRef>& rows);

}  // namespace olmosft::train
