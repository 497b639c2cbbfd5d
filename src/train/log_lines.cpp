#include "train/log_lines.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace olmosft::train {

namespace {

std::string f(const char* spec, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}
std::string fmt6(double v) { return f("%.6f", v); }
std::string opt6(const std::optional<double>& v) { return v ? fmt6(*v) : "n/a"; }

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = static_cast<long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  return buf;
}

std::string join0(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : ",") + f("%.0f", x);
  return s;
}

// Reads a line in the order its format wrote it: literals, numbers, words. Any mismatch sets ok = false and
// every later read fails, so a parse is one && chain ending in done().
class Scan {
 public:
  // Positions after `tag`, found at the start of text or after a space; ok = false if absent.
  Scan(const std::string& text, const std::string& tag) : s_(text) {
    size_t p = 0;
    while ((p = s_.find(tag, p)) != std::string::npos && p > 0 && s_[p - 1] != ' ') ++p;
    ok_ = p != std::string::npos;
    i_ = ok_ ? p + tag.size() : 0;
  }
  bool lit(const char* l) {
    std::string_view v(l);
    if (!ok_ || s_.compare(i_, v.size(), v) != 0) return ok_ = false;
    i_ += v.size();
    return true;
  }
  bool try_lit(const char* l) {  // consumes l if it is next; never fails the scan
    std::string_view v(l);
    if (!ok_ || s_.compare(i_, v.size(), v) != 0) return false;
    i_ += v.size();
    return true;
  }
  bool i64(int64_t& out) {
    if (!ok_ || i_ >= s_.size() || s_[i_] == ' ' || s_[i_] == '+') return ok_ = false;
    const char* b = s_.c_str() + i_;
    char* e = nullptr;
    errno = 0;
    long long v = std::strtoll(b, &e, 10);
    if (e == b || errno != 0) return ok_ = false;
    out = v;
    i_ += static_cast<size_t>(e - b);
    return true;
  }
  bool f64(double& out) {
    if (!ok_ || i_ >= s_.size() || s_[i_] == ' ' || s_[i_] == '+') return ok_ = false;
    const char* b = s_.c_str() + i_;
    char* e = nullptr;
    double v = std::strtod(b, &e);
    if (e == b) return ok_ = false;
    out = v;
    i_ += static_cast<size_t>(e - b);
    return true;
  }
  bool opt_f64(std::optional<double>& out) {
    if (try_lit("n/a")) return out.reset(), true;
    double v = 0;
    if (!f64(v)) return false;
    out = v;
    return true;
  }
  bool hms_s(double& out) {  // H:MM:SS or "?" (-1)
    if (try_lit("?")) return out = -1, true;
    int64_t h = 0, m = 0, s = 0;
    if (!(i64(h) && lit(":") && i64(m) && lit(":") && i64(s))) return false;
    if (h < 0 || m < 0 || m > 59 || s < 0 || s > 59) return ok_ = false;
    out = static_cast<double>(h * 3600 + m * 60 + s);
    return true;
  }
  bool word(std::string& out) {  // a non-empty run up to the next space
    if (!ok_) return false;
    size_t e = s_.find(' ', i_);
    if (e == std::string::npos) e = s_.size();
    if (e == i_) return ok_ = false;
    out = s_.substr(i_, e - i_);
    i_ = e;
    return true;
  }
  bool list(std::vector<double>& out) {  // a,b,c (at least one)
    out.clear();
    do {
      double v = 0;
      if (!f64(v)) return false;
      out.push_back(v);
    } while (try_lit(","));
    return true;
  }
  bool done() {  // only whitespace (a trailing \r or \n) may follow
    if (!ok_) return false;
    for (size_t j = i_; j < s_.size(); ++j)
      if (s_[j] != ' ' && s_[j] != '\r' && s_[j] != '\n' && s_[j] != '\t') return ok_ = false;
    return true;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;
  bool ok_ = false;
};

template <class T>
std::optional<T> when(bool ok, T v) {
  return ok ? std::optional<T>(std::move(v)) : std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------- LOSS-PARTS

std::string format_loss_parts(const LossPartsLine& l) {
  std::string s = "LOSS-PARTS step=" + std::to_string(l.step);
  for (size_t t = 0; t < model::kLossTermCount; ++t)
    s += std::string(" ") + model::kLossTerms[t].name + "=" + fmt6(l.terms[t]);
  return s + " tokens=" + std::to_string(l.tokens);
}

std::optional<LossPartsLine> parse_loss_parts_line(const std::string& text) {
  LossPartsLine l;
  Scan c(text, "LOSS-PARTS ");
  bool ok = c.lit("step=") && c.i64(l.step);
  for (size_t t = 0; t < model::kLossTermCount && ok; ++t)
    ok = c.lit((std::string(" ") + model::kLossTerms[t].name + "=").c_str()) && c.f64(l.terms[t]);
  ok = ok && c.lit(" tokens=") && c.i64(l.tokens) && c.done();
  return when(ok, l);
}

// ---------------------------------------------------------------- PROGRESS

std::string format_progress(const ProgressLine& l) {
  return "PROGRESS step=" + std::to_string(l.step) + "/" + std::to_string(l.steps) +
         " steps_per_s=" + f("%.4g", l.steps_per_s) + " tokens_per_s=" + f("%.4g", l.tokens_per_s) +
         " elapsed=" + hms(l.elapsed_s) + " eta=" + hms(l.eta_s);
}

std::optional<ProgressLine> parse_progress_line(const std::string& text) {
  ProgressLine l;
  Scan c(text, "PROGRESS ");
  bool ok = c.lit("step=") && c.i64(l.step) && c.lit("/") && c.i64(l.steps) && c.lit(" steps_per_s=") &&
            c.f64(l.steps_per_s) && c.lit(" tokens_per_s=") && c.f64(l.tokens_per_s) && c.lit(" elapsed=") &&
            c.hms_s(l.elapsed_s) && c.lit(" eta=") && c.hms_s(l.eta_s) && c.done();
  return when(ok, l);
}

// ---------------------------------------------------------------- REQUIRED_RBF

std::string format_required_rbf(const RequiredRbfLine& l) {
  return "REQUIRED_RBF step=" + std::to_string(l.step) + " value=" + fmt6(l.value);
}

std::optional<RequiredRbfLine> parse_required_rbf_line(const std::string& text) {
  RequiredRbfLine l;
  Scan c(text, "REQUIRED_RBF ");
  bool ok = c.lit("step=") && c.i64(l.step) && c.lit(" value=") && c.f64(l.value) && c.done();
  return when(ok, l);
}

// ---------------------------------------------------------------- XLA

std::string format_xla(const XlaLine& l) {
  return "XLA plugin=" + l.plugin + " platform=" + l.platform + " devices=" + std::to_string(l.devices) +
         " compiles=" + std::to_string(l.compiles) + " compile_s=" + f("%.3g", l.compile_s) +
         " executions=" + std::to_string(l.executions);
}

std::optional<XlaLine> parse_xla_line(const std::string& text) {
  XlaLine l;
  Scan c(text, "XLA ");
  bool ok = c.lit("plugin=") && c.word(l.plugin) && c.lit(" platform=") && c.word(l.platform) &&
            c.lit(" devices=") && c.i64(l.devices) && c.lit(" compiles=") && c.i64(l.compiles) &&
            c.lit(" compile_s=") && c.f64(l.compile_s) && c.lit(" executions=") && c.i64(l.executions) &&
            c.done();
  return when(ok, l);
}

std::string format_xla_program(const XlaProgramLine& l) {
  return "XLA-PROGRAM kind=" + l.kind + " B=" + std::to_string(l.B) + " T=" + std::to_string(l.T) +
         " devices=" + std::to_string(l.devices) + " compile_s=" + f("%.3g", l.compile_s) +
         " argument_bytes=" + std::to_string(l.argument_bytes) +
         " output_bytes=" + std::to_string(l.output_bytes) + " alias_bytes=" + std::to_string(l.alias_bytes) +
         " temp_bytes=" + std::to_string(l.temp_bytes) + " total_bytes=" + std::to_string(l.total_bytes);
}

std::optional<XlaProgramLine> parse_xla_program_line(const std::string& text) {
  XlaProgramLine l;
  Scan c(text, "XLA-PROGRAM ");
  bool ok = c.lit("kind=") && c.word(l.kind) && c.lit(" B=") && c.i64(l.B) && c.lit(" T=") && c.i64(l.T) &&
            c.lit(" devices=") && c.i64(l.devices) && c.lit(" compile_s=") && c.f64(l.compile_s) &&
            c.lit(" argument_bytes=") && c.i64(l.argument_bytes) && c.lit(" output_bytes=") &&
            c.i64(l.output_bytes) && c.lit(" alias_bytes=") && c.i64(l.alias_bytes) &&
            c.lit(" temp_bytes=") && c.i64(l.temp_bytes) && c.lit(" total_bytes=") && c.i64(l.total_bytes) &&
            c.done();
  return when(ok, l);
}

// ---------------------------------------------------------------- DIST

std::string format_dist(const DistLine& l) {
  return "DIST mode=" + l.mode + " processes=" + std::to_string(l.processes) + " comm=" + l.comm +
         " gather=" + l.gather + " params=" + std::to_string(l.params) +
         " sent_bytes_per_step_per_rank=" + join0(l.sent_bytes_per_step_per_rank) +
         " minimum_bytes=" + f("%.0f", l.minimum_bytes) +
         " persistent_bytes_per_rank=" + join0(l.persistent_bytes_per_rank) +
         " peak_transient_bytes_per_rank=" + join0(l.peak_transient_bytes_per_rank) +
         " rss_bytes_per_rank=" + join0(l.rss_bytes_per_rank);
}

std::optional<DistLine> parse_dist_line(const std::string& text) {
  DistLine l;
  Scan c(text, "DIST ");
  bool ok = c.lit("mode=") && c.word(l.mode) && c.lit(" processes=") && c.i64(l.processes) &&
            c.lit(" comm=") && c.word(l.comm) && c.lit(" gather=") && c.word(l.gather) && c.lit(" params=") &&
            c.i64(l.params) && c.lit(" sent_bytes_per_step_per_rank=") &&
            c.list(l.sent_bytes_per_step_per_rank) && c.lit(" minimum_bytes=") && c.f64(l.minimum_bytes) &&
            c.lit(" persistent_bytes_per_rank=") && c.list(l.persistent_bytes_per_rank) &&
            c.lit(" peak_transient_bytes_per_rank=") && c.list(l.peak_transient_bytes_per_rank) &&
            c.lit(" rss_bytes_per_rank=") && c.list(l.rss_bytes_per_rank) && c.done();
  return when(ok, l);
}

// ---------------------------------------------------------------- CHECK

namespace {
const char* const kEosFail = "FAIL: the model never learns to stop";
const char* const kStep1Tail = " (compare with a reference forward of the step-1 rows)";
}  // namespace

std::string format_check_trained_eos(const CheckTrainedEosLine& l) {
  return "CHECK trained_eos count=" + std::to_string(l.count) + " of " + std::to_string(l.trained_targets) +
         " trained targets (eos_id=" + std::to_string(l.eos_id) + ") " + (l.pass ? "PASS" : kEosFail);
}

std::optional<CheckTrainedEosLine> parse_check_trained_eos_line(const std::string& text) {
  CheckTrainedEosLine l;
  Scan c(text, "CHECK trained_eos ");
  bool ok = c.lit("count=") && c.i64(l.count) && c.lit(" of ") && c.i64(l.trained_targets) &&
            c.lit(" trained targets (eos_id=") && c.i64(l.eos_id) && c.lit(") ");
  l.pass = c.try_lit("PASS");
  ok = ok && (l.pass || c.lit(kEosFail)) && c.done();
  return when(ok, l);
}

std::string format_check_p_eos(const CheckPEosLine& l) {
  return "CHECK p_eos rows=" + std::to_string(l.rows) + (l.held_out ? " (held out)" : " (seen in training)") +
         " positions=" + std::to_string(l.positions) + " before=" + opt6(l.before) +
         " after=" + opt6(l.after);
}

std::optional<CheckPEosLine> parse_check_p_eos_line(const std::string& text) {
  CheckPEosLine l;
  Scan c(text, "CHECK p_eos ");
  bool ok = c.lit("rows=") && c.i64(l.rows);
  l.held_out = c.try_lit(" (held out)");
  ok = ok && (l.held_out || c.lit(" (seen in training)")) && c.lit(" positions=") && c.i64(l.positions) &&
       c.lit(" before=") && c.opt_f64(l.before) && c.lit(" after=") && c.opt_f64(l.after) && c.done();
  return when(ok, l);
}

std::string format_check_eval_ce(const CheckEvalCeLine& l) {
  return "CHECK eval_ce rows=" + std::to_string(l.rows) + " targets=" + std::to_string(l.targets) +
         " ce=" + (l.ce ? f("%.9g", *l.ce) : "n/a") + " epoch0_rows=" + std::to_string(l.first_row) + ":" +
         std::to_string(l.end_row) + " (the p_eos rows)";
}

std::optional<CheckEvalCeLine> parse_check_eval_ce_line(const std::string& text) {
  CheckEvalCeLine l;
  Scan c(text, "CHECK eval_ce ");
  bool ok = c.lit("rows=") && c.i64(l.rows) && c.lit(" targets=") && c.i64(l.targets) && c.lit(" ce=") &&
            c.opt_f64(l.ce) && c.lit(" epoch0_rows=") && c.i64(l.first_row) && c.lit(":") &&
            c.i64(l.end_row) && c.lit(" (the p_eos rows)") && c.done();
  return when(ok, l);
}

std::string format_check_step1_ce(const CheckStep1CeLine& l) {
  return "CHECK step1_ce=" + fmt6(l.ce) + kStep1Tail;
}

std::optional<CheckStep1CeLine> parse_check_step1_ce_line(const std::string& text) {
  CheckStep1CeLine l;
  Scan c(text, "CHECK step1_ce=");
  bool ok = c.f64(l.ce) && c.lit(kStep1Tail) && c.done();
  return when(ok, l);
}

}  // namespace olmosft::train
