// Evaluation in a run: P(EOS) on held-out rows before and after training (and their mean CE), and the
// end-of-run CHECK lines (trained EOS targets, p_eos, eval_ce, step1_ce). Rank 0 runs them.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "model/model.h"
#include "train/batch.h"

namespace olmosft::train {

// Mean P(target) over positions whose trained target is `eos`; returns (mean, count) (mean NaN when none).
// When `ce` is given it receives the CE sum and the trained-target count over the same rows (same forwards).
struct EvalCe {
  double ce_sum = 0;
  int64_t targets = 0;
};
std::pair<double, int64_t> p_eos(model::CausalLM& m, const PackedDataset& ds, const std::vector<RowRef>& rows,
                                 int32_t eos, const model::LossConfig& lc, EvalCe* ce = nullptr);

// Up to `count` rows of epoch 0 for P(EOS): the first the run does not train on (steps x global_batch rows
// from the start) when there are any (held_out), else the first rows.
struct Heldout {
  std::vector<RowRef> rows;
  bool held_out = false;
};
Heldout heldout_rows(const PackedDataset& ds, int64_t count, int64_t steps, int64_t global_batch);

// The end-of-run checks (rank 0): prints the CHECK lines from the data of steps 1..steps, the held-out rows
// (after training; `carried` holds p_eos_before and step1_ce). False when no trained target is EOS.
bool end_of_run_checks(model::CausalLM& m, const PackedDataset& ds, const DataOrder& order, int64_t steps,
                       int32_t eos_id, const model::LossConfig& lc, const Heldout& heldout,
                       const nlohmann::json& carried, std::ostream& out);

}  // namespace olmosft::train
