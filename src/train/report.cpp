#include "train/report.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "train/log_lines.h"
#include "train/metrics.h"

namespace fs = std::filesystem;

namespace olmosft::train {

nlohmann::json metrics_row(const StepReport& r) {
  nlohmann::json row;
  row["step"] = r.step;
  row["lr"] = r.lr;
  row["loss"] = r.loss;
  for (size_t t = 0; t < model::kLossTermCount; ++t) row[model::kLossTerms[t].name] = r.terms[t];
  row["grad_norm"] = r.grad_norm;
  row["tokens"] = r.tokens;
  row["padded_tokens"] = r.padded_tokens;
  row["tokens_per_s"] = r.tokens_per_s;
  row["trained_tokens_per_s"] = r.trained_tokens_per_s;
  row["step_time"] = r.step_time;
  row["model_flops"] = r.model_flops;
  row["mfu"] = r.mfu;
  row["stalled"] = r.stalled;
  nlohmann::json dropped = nlohmann::json::array(), rbf = nlohmann::json::array();
  for (const auto& [layer, ls] : r.moe) {
    dropped.push_back(ls.dropped_tokens);
    rbf.push_back(ls.required_buffer_factor);
  }
  row["moe_dropped_tokens"] = dropped;
  row["moe_required_buffer_factor"] = rbf;
  return row;
}

RunLog::RunLog(const std::string& run_dir, int64_t start, int64_t steps, int64_t log_every, bool tensorboard,
               bool rank0)
    : start_(start), steps_(steps), every_(log_every), rank0_(rank0) {
  if (!rank0_) return;
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  std::string kept;
  if (start > 0 && fs::exists(metrics_path)) {
    std::istringstream is(io::read_file(metrics_path));
    std::string line;
    while (std::getline(is, line)) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.value("step", int64_t{0}) <= start) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
      }
    }
  }
  io::write_file_atomic(metrics_path, kept);
  metrics_.open(metrics_path, std::ios::app);
  OLMO_CHECK(metrics_.good(), "cannot open ", metrics_path, " for appending");
  if (tensorboard) tb_ = std::make_unique<io::TensorBoardWriter>(run_dir + "/tensorboard");
}

void RunLog::begin() { t0_ = Clock::now(); }

void RunLog::step(const StepReport& r, std::ostream& out) {
  const int64_t s = r.step;
  if (!r.moe.empty()) {  // every step: `k8s watch`'s max_required_rbf rule reads it
    double max_rbf = 0;
    for (const auto& [layer, ls] : r.moe) max_rbf = std::max(max_rbf, ls.required_buffer_factor);
    out << format_required_rbf({s, max_rbf}) << "\n";
  }
  if (s % every_ == 0 || s == steps_ || s == start_ + 1) {
    out << format_loss_parts({s, r.terms, r.tokens}) << "\n";
    double elapsed = seconds_since(t0_);
    double rate = static_cast<double>(s - start_) / elapsed;
    out << format_progress({s, steps_, rate, r.tokens_per_s, elapsed, static_cast<double>(steps_ - s) / rate})
        << "\n";
  }
  if (!rank0_) return;
  const nlohmann::json row = metrics_row(r);
  metrics_ << row.dump() << "\n";
  metrics_.flush();
  if (tb_) tb_->add_scalars(s, tensorboard_scalars(row));
}

}  // namespace olmosft::train
