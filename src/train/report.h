// What a run reports per step: one StepReport feeds the stdout lines (REQUIRED_RBF, LOSS-PARTS, PROGRESS;
// train/log_lines.h), the metrics.jsonl row and the TensorBoard scalars (train/metrics.h), so they cannot
// disagree. Rank 0 writes; on other ranks a RunLog writes nothing.
#pragma once
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/tensorboard.h"
#include "model/model.h"
#include "train/perf.h"

namespace olmosft::train {

struct StepReport {
  int64_t step = 0;
  double lr = 0, loss = 0, grad_norm = 0;
  model::LossValues terms{};  // the step's value of each loss term (model/loss_terms.h)
  int64_t tokens = 0;         // trained targets (the loss denominator)
  int64_t padded_tokens = 0;  // global_batch x seq_len
  double tokens_per_s = 0, trained_tokens_per_s = 0, step_time = 0, mfu = 0;
  double model_flops = 0;  // of the step, all ranks (train/flops.h)
  bool stalled = false;
  std::map<int64_t, model::MoeLayerStats> moe;  // by layer (MoE models)
};

// The metrics.jsonl row of a step (docs/train.md).
nlohmann::json metrics_row(const StepReport& r);

class RunLog {
 public:
  // Opens RUN_DIR/metrics.jsonl (rank 0; a resumed run keeps only the rows of steps <= start: a crash may
  // have logged steps past the checkpoint) and RUN_DIR/tensorboard when asked.
  RunLog(const std::string& run_dir, int64_t start, int64_t steps, int64_t log_every, bool tensorboard,
         bool rank0);
  void begin();  // the run's clock starts (PROGRESS rates)
  // REQUIRED_RBF (MoE, every step), LOSS-PARTS + PROGRESS (every log_every steps, the first and the last
  // step), the metrics row and the TensorBoard scalars.
  void step(const StepReport& r, std::ostream& out);

 private:
  int64_t start_, steps_, every_;
  bool rank0_;
  std::ofstream metrics_;
  std::unique_ptr<io::TensorBoardWriter> tb_;
  Clock::time_point t0_;
};

}  // namespace olmosft::train
