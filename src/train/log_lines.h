#pragma once
// The trainer's typed log lines: one struct per line kind, ONE format and ONE parse function each. The
// trainer prints with format_*; `k8s watch` (src/cluster/k8s_ops.cpp) and the tests read with parse_*.
// format_* returns the line without the trailing newline, byte-identical to what the trainer printed before
// these types existed (tests, docs and scripts/demo.sh grep and awk these lines). parse_* finds the line's
// tag at the start of the text or after a space (a pod log may prefix a timestamp), reads the fields in
// the order format_* writes them and returns nullopt for anything else (a missing or extra field, a value
// that is not a number, trailing text). Non-finite numbers ("nan", "-nan", "inf") parse as such. Reference:
// docs/train.md "Log lines".
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/loss_terms.h"

namespace olmosft::train {

// LOSS-PARTS step=12 ce=0.912345 lm_z=0.000123 moe_lb=0.010012 router_z=0.000045 tokens=812345
// (%.6f each; tokens = trained targets of the global step, the loss denominator).
// One name=value per loss term, in model/loss_terms.h's order.
struct LossPartsLine {
  int64_t step = 0;
  model::LossValues terms{};
  int64_t tokens = 0;
  bool operator==(const LossPartsLine&) const = default;
};
std::string format_loss_parts(const LossPartsLine& l);
std::optional<LossPartsLine> parse_loss_parts_line(const std::string& text);

// PROGRESS step=12/600 steps_per_s=0.25 tokens_per_s=2.621e+05 elapsed=0:00:48 eta=0:39:12
// (rates %.4g; times H:MM:SS rounded to whole seconds, "?" when unknown: a negative or non-finite value,
// which parses back as -1).
struct ProgressLine {
  int64_t step = 0, steps = 0;
  double steps_per_s = 0, tokens_per_s = 0;
  double elapsed_s = 0, eta_s = 0;
  bool operator==(const ProgressLine&) const = default;
};
std::string format_progress(const ProgressLine& l);
std::optional<ProgressLine> parse_progress_line(const std::string& text);

// REQUIRED_RBF step=12 value=1.875000 (%.6f): the largest MoE required buffer factor (max expert load /
// balanced load, src/kernels/moe.h) over the MoE layers of that step, every step, MoE models only.
struct RequiredRbfLine {
  int64_t step = 0;
  double value = 0;
  bool operator==(const RequiredRbfLine&) const = default;
};
std::string format_required_rbf(const RequiredRbfLine& l);
std::optional<RequiredRbfLine> parse_required_rbf_line(const std::string& text);

// XLA plugin=cpu platform=cpu devices=1 compiles=2 compile_s=1.23 executions=24 (device: xla, docs/xla.md):
// printed when the model is built (counts 0) and at the end of the run (compile_s %.3g).
struct XlaLine {
  std::string plugin, platform;
  int64_t devices = 0, compiles = 0;
  double compile_s = 0;
  int64_t executions = 0;
  bool operator==(const XlaLine&) const = default;
};
std::string format_xla(const XlaLine& l);
std::optional<XlaLine> parse_xla_line(const std::string& text);

// XLA-PROGRAM kind=step B=2 T=256 devices=1 compile_s=%.3g argument_bytes=A output_bytes=O alias_bytes=L
// temp_bytes=M total_bytes=X: one per program the XLA backend compiles (kind step, forward, norm or update; B
// and T 0 for the norm and update programs), printed before it first runs; bytes per device, XLA's own
// statistics.
struct XlaProgramLine {
  std::string kind;
  int64_t B = 0, T = 0, devices = 0;
  double compile_s = 0;
  int64_t argument_bytes = 0, output_bytes = 0, alias_bytes = 0, temp_bytes = 0, total_bytes = 0;
  bool operator==(const XlaProgramLine&) const = default;
};
std::string format_xla_program(const XlaProgramLine& l);
std::optional<XlaProgramLine> parse_xla_program_line(const std::string& text);

// DIST mode=zero3 processes=4 comm=mpi gather=per-layer params=P sent_bytes_per_step_per_rank=a,b,c,d
// minimum_bytes=M persistent_bytes_per_rank=... peak_transient_bytes_per_rank=... rss_bytes_per_rank=...
// (one line; byte counts %.0f, one per rank, comma-separated).
struct DistLine {
  std::string mode;
  int64_t processes = 0;
  std::string comm, gather;
  int64_t params = 0;
  std::vector<double> sent_bytes_per_step_per_rank;
  double minimum_bytes = 0;
  std::vector<double> persistent_bytes_per_rank, peak_transient_bytes_per_rank, rss_bytes_per_rank;
  bool operator==(const DistLine&) const = default;
};
std::string format_dist(const DistLine& l);
std::optional<DistLine> parse_dist_line(const std::string& text);

// The end-of-run CHECK lines (rank 0).
// CHECK trained_eos count=1234 of 812345 trained targets (eos_id=100257) PASS
//   (or "... FAIL: the model never learns to stop" when count is 0)
struct CheckTrainedEosLine {
  int64_t count = 0, trained_targets = 0, eos_id = 0;
  bool pass = false;
  bool operator==(const CheckTrainedEosLine&) const = default;
};
std::string format_check_trained_eos(const CheckTrainedEosLine& l);
std::optional<CheckTrainedEosLine> parse_check_trained_eos_line(const std::string& text);

// CHECK p_eos rows=32 (held out) positions=40 before=0.000012 after=0.871234
//   ("(seen in training)" when the rows were trained on; before/after %.6f or "n/a")
struct CheckPEosLine {
  int64_t rows = 0;
  bool held_out = true;
  int64_t positions = 0;
  std::optional<double> before, after;
  bool operator==(const CheckPEosLine&) const = default;
};
std::string format_check_p_eos(const CheckPEosLine& l);
std::optional<CheckPEosLine> parse_check_p_eos_line(const std::string& text);

// CHECK eval_ce rows=32 targets=1234 ce=1.23456789 epoch0_rows=600:632 (the p_eos rows)
//   (ce %.9g or "n/a"; epoch0_rows = first:end, end exclusive)
struct CheckEvalCeLine {
  int64_t rows = 0, targets = 0;
  std::optional<double> ce;
  int64_t first_row = 0, end_row = 0;
  bool operator==(const CheckEvalCeLine&) const = default;
};
std::string format_check_eval_ce(const CheckEvalCeLine& l);
std::optional<CheckEvalCeLine> parse_check_eval_ce_line(const std::string& text);

// CHECK step1_ce=1.077855 (compare with a reference forward of the step-1 rows)   (%.6f)
struct CheckStep1CeLine {
  double ce = 0;
  bool operator==(const CheckStep1CeLine&) const = default;
};
std::string format_check_step1_ce(const CheckStep1CeLine& l);
std::optional<CheckStep1CeLine> parse_check_step1_ce_line(const std::string& text);

}  // namespace olmosft::train
