#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <ostream>

#include "train/log_lines.h"

namespace olmosft::train {

std::pair<double, int64_t> p_eos(model::CausalLM& m, const PackedDataset& ds, const std::vector<RowRef>& rows,
                                 int32_t eos, const model::LossConfig& lc, EvalCe* ce) {
  double sum = 0;
  int64_t n = 0;
  for (const RowRef& r : rows) {
    HostBatch b = make_batch(ds, {r});
    std::vector<float> lp(static_cast<size_t>(b.T), 0.0f);
    model::LossParts parts = m.forward(b.view(), lc, nullptr, lp.data());
    if (ce) {
      ce->ce_sum += parts.sum[model::kLossCe];
      ce->targets += parts.tokens;
    }
    for (int64_t t = 0; t < b.T; ++t) {
      if (b.trained[t] && b.targets[t] == eos) {
        sum += std::exp(static_cast<double>(lp[t]));
        ++n;
      }
    }
  }
  return {n ? sum / static_cast<double>(n) : std::nan(""), n};
}

Heldout heldout_rows(const PackedDataset& ds, int64_t count, int64_t steps, int64_t global_batch) {
  Heldout h;
  int64_t used0 = std::min(ds.rows(0), steps * global_batch);
  int64_t first = used0 < ds.rows(0) ? used0 : 0;
  h.held_out = used0 < ds.rows(0);
  for (int64_t i = first; i < ds.rows(0) && static_cast<int64_t>(h.rows.size()) < count; ++i)
    h.rows.push_back(RowRef{0, i});
  return h;
}

bool end_of_run_checks(model::CausalLM& m, const PackedDataset& ds, const DataOrder& order, int64_t steps,
                       int32_t eos_id, const model::LossConfig& lc, const Heldout& heldout,
                       const nlohmann::json& carried, std::ostream& out) {
  int64_t eos_targets = 0, trained_targets = 0;
  for (int64_t s = 1; s <= steps; ++s) {
    for (const RowRef& r : order.step_rows(s, 0, 1)) {
      PackedRow pr = ds.row(r.epoch, r.index);
      std::vector<int32_t> tg = pr.targets(-100);
      for (int32_t t : tg) {
        trained_targets += t != -100;
        eos_targets += t == eos_id;
      }
    }
  }
  const bool checks_ok = eos_targets > 0;
  out << format_check_trained_eos({eos_targets, trained_targets, eos_id, checks_ok}) << "\n";
  const std::vector<RowRef>& rows = heldout.rows;
  if (!rows.empty() && eos_id >= 0) {
    EvalCe ec;
    auto [p, n] = p_eos(m, ds, rows, eos_id, lc, &ec);
    auto before = carried.value("p_eos_before", nlohmann::json(nullptr));
    CheckPEosLine pl{static_cast<int64_t>(rows.size()), heldout.held_out, n, std::nullopt, std::nullopt};
    if (before.is_number()) pl.before = before.get<double>();
    if (std::isfinite(p)) pl.after = p;
    out << format_check_p_eos(pl) << "\n";
    CheckEvalCeLine el{static_cast<int64_t>(rows.size()), ec.targets, std::nullopt,
                       static_cast<int64_t>(rows.front().index), static_cast<int64_t>(rows.back().index) + 1};
    if (ec.targets > 0) el.ce = ec.ce_sum / static_cast<double>(ec.targets);
    out << format_check_eval_ce(el) << "\n";
  }
  if (carried.contains("step1_ce")) out << format_check_step1_ce({carried["step1_ce"].get<double>()}) << "\n";
  return checks_ok;
}

}  // namespace olmosft::train
