// The trainer's typed log lines (train/log_lines.h): each format_* writes the exact text the trainer printed
// before the types existed (pinned strings below; tests, docs and scripts/demo.sh read it), parse_* of that
// text gives the struct back, and malformed lines parse to nullopt.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "train/log_lines.h"

using namespace olmosft::train;

TEST(LogLines, LossParts) {
  LossPartsLine l{12, {0.912345, 0.000123, 0.010012, 0.000045}, 812345};
  const std::string t =
      "LOSS-PARTS step=12 ce=0.912345 lm_z=0.000123 moe_lb=0.010012 router_z=0.000045 tokens=812345";
  EXPECT_EQ(format_loss_parts(l), t);
  EXPECT_EQ(parse_loss_parts_line(t), l);
  EXPECT_EQ(parse_loss_parts_line("I1202 12:00:00 " + t + "\r"), l);  // a prefix and a trailing \r
  auto n = parse_loss_parts_line("LOSS-PARTS step=3 ce=nan lm_z=-nan moe_lb=inf router_z=0.000000 tokens=4");
  ASSERT_TRUE(n);
  EXPECT_TRUE(std::isnan(n->terms[olmosft::model::kLossCe]));
  EXPECT_TRUE(std::isnan(n->terms[olmosft::model::kLossLmZ]));
  EXPECT_TRUE(std::isinf(n->terms[olmosft::model::kLossMoeLb]));
  EXPECT_EQ(format_loss_parts({3, {std::nan(""), 0, 0, 0}, 4}).substr(0, 24), "LOSS-PARTS step=3 ce=nan");
  EXPECT_FALSE(parse_loss_parts_line("LOSS-PARTS step=3 ce=nan"));  // fields missing
  EXPECT_FALSE(parse_loss_parts_line(t + " extra=1"));              // trailing text
  EXPECT_FALSE(parse_loss_parts_line("LOSS-PARTS step=x ce=1"));    // not a number
  EXPECT_FALSE(parse_loss_parts_line("XLOSS-PARTS step=12 ce=0.9 lm_z=0 moe_lb=0 router_z=0 tokens=1"));
  EXPECT_FALSE(
      parse_loss_parts_line("LOSS-PARTS step=12 lm_z=0 ce=0.9 moe_lb=0 router_z=0 tokens=1"));  // order
  EXPECT_FALSE(parse_loss_parts_line("completed step: 3, loss: 1.2"));
}

TEST(LogLines, Progress) {
  ProgressLine l{12, 600, 0.25, 262144, 48, 2352};
  const std::string t =
      "PROGRESS step=12/600 steps_per_s=0.25 tokens_per_s=2.621e+05 elapsed=0:00:48 eta=0:39:12";
  EXPECT_EQ(format_progress(l), t);
  auto p = parse_progress_line(t);
  ASSERT_TRUE(p);
  l.tokens_per_s = 262100;  // %.4g
  EXPECT_EQ(*p, l);
  EXPECT_EQ(format_progress(*p), t);
  ProgressLine u{1, 2, 1.5, 100, std::numeric_limits<double>::infinity(), -3};
  EXPECT_EQ(format_progress(u), "PROGRESS step=1/2 steps_per_s=1.5 tokens_per_s=100 elapsed=? eta=?");
  u.elapsed_s = u.eta_s = -1;
  EXPECT_EQ(parse_progress_line(format_progress(u)), u);
  EXPECT_FALSE(
      parse_progress_line("PROGRESS step=12 steps_per_s=0.25 tokens_per_s=1 elapsed=0:00:48 eta=0:39:12"));
  EXPECT_FALSE(
      parse_progress_line("PROGRESS step=1/2 steps_per_s=0.25 tokens_per_s=1 elapsed=0:61:00 eta=?"));
  EXPECT_FALSE(parse_progress_line("PROGRESS step=1/2 steps_per_s=fast tokens_per_s=1 elapsed=? eta=?"));
}

TEST(LogLines, RequiredRbf) {
  RequiredRbfLine l{7, 2.24};
  EXPECT_EQ(format_required_rbf(l), "REQUIRED_RBF step=7 value=2.240000");
  EXPECT_EQ(parse_required_rbf_line(format_required_rbf(l)), l);
  EXPECT_EQ(parse_required_rbf_line("2025-12-02T00:00:01Z REQUIRED_RBF step=7 value=2.240000"), l);
  EXPECT_FALSE(parse_required_rbf_line("REQUIRED_RBF=2.24"));
  EXPECT_FALSE(parse_required_rbf_line("REQUIRED_RBF: 2.24"));
  EXPECT_FALSE(parse_required_rbf_line("REQUIRED_RBF step=7 value="));
  EXPECT_FALSE(parse_required_rbf_line("REQUIRED_RBF step=7 value=2.24 layer=3"));
}

TEST(LogLines, Xla) {
  XlaLine l{"cpu", "cpu", 1, 2, 1.25, 24};
  EXPECT_EQ(format_xla(l), "XLA plugin=cpu platform=cpu devices=1 compiles=2 compile_s=1.25 executions=24");
  EXPECT_EQ(parse_xla_line(format_xla(l)), l);
  XlaLine p{"/opt/pjrt/xla_cuda_plugin.so", "cuda", 8, 0, 0, 0};
  EXPECT_EQ(parse_xla_line("2026-12-05T07:00:00Z " + format_xla(p)), p);
  EXPECT_FALSE(parse_xla_line("XLA plugin=cpu platform=cpu devices=1 compiles=2 compile_s=1.25"));
  EXPECT_FALSE(parse_xla_line("XLA plugin=cpu platform=cpu devices=one compiles=2 compile_s=1 executions=2"));
  EXPECT_FALSE(parse_xla_line("XLA plugin= platform=cpu devices=1 compiles=2 compile_s=1 executions=2"));
}

TEST(LogLines, XlaProgram) {
  XlaProgramLine l{"step", 2, 256, 2, 1.5, 4000, 3000, 0, 12345, 19345};
  const std::string t =
      "XLA-PROGRAM kind=step B=2 T=256 devices=2 compile_s=1.5 argument_bytes=4000 output_bytes=3000 "
      "alias_bytes=0 temp_bytes=12345 total_bytes=19345";
  EXPECT_EQ(format_xla_program(l), t);
  EXPECT_EQ(parse_xla_program_line(t), l);
  EXPECT_EQ(parse_xla_program_line("2026-12-06T19:00:00Z " + t), l);
  EXPECT_FALSE(parse_xla_program_line(t.substr(0, t.size() - 6)));
  EXPECT_FALSE(
      parse_xla_program_line("XLA-PROGRAM kind= B=2 T=256 devices=2 compile_s=1.5 argument_bytes=1 "
                             "output_bytes=1 alias_bytes=0 temp_bytes=1 total_bytes=3"));
  EXPECT_FALSE(parse_xla_line(t)) << "not an XLA line";
}

TEST(LogLines, Dist) {
  DistLine l{"zero3", 2, "mpi", "per-layer", 1234, {100, 200}, 150, {10, 20}, {1, 2}, {3e9, 4e9}};
  const std::string t =
      "DIST mode=zero3 processes=2 comm=mpi gather=per-layer params=1234 "
      "sent_bytes_per_step_per_rank=100,200 "
      "minimum_bytes=150 persistent_bytes_per_rank=10,20 peak_transient_bytes_per_rank=1,2 "
      "rss_bytes_per_rank=3000000000,4000000000";
  EXPECT_EQ(format_dist(l), t);
  EXPECT_EQ(parse_dist_line(t), l);
  EXPECT_FALSE(parse_dist_line("DIST mode=zero3 processes=2"));
  EXPECT_FALSE(parse_dist_line(t.substr(0, t.size() - 10)));  // the rss list cut to "3000000000,"
  EXPECT_FALSE(
      parse_dist_line("DIST mode= processes=2 comm=mpi gather=none params=1 sent_bytes_per_step_per_rank=1 "
                      "minimum_bytes=1 persistent_bytes_per_rank=1 peak_transient_bytes_per_rank=1 "
                      "rss_bytes_per_rank=1"));
}

TEST(LogLines, Checks) {
  CheckTrainedEosLine e{1234, 812345, 100257, true};
  const std::string et = "CHECK trained_eos count=1234 of 812345 trained targets (eos_id=100257) PASS";
  EXPECT_EQ(format_check_trained_eos(e), et);
  EXPECT_EQ(parse_check_trained_eos_line(et), e);
  CheckTrainedEosLine ef{0, 10, 2, false};
  EXPECT_EQ(
      format_check_trained_eos(ef),
      "CHECK trained_eos count=0 of 10 trained targets (eos_id=2) FAIL: the model never learns to stop");
  EXPECT_EQ(parse_check_trained_eos_line(format_check_trained_eos(ef)), ef);
  EXPECT_FALSE(
      parse_check_trained_eos_line("CHECK trained_eos count=0 of 10 trained targets (eos_id=2) MAYBE"));

  CheckPEosLine p{32, true, 40, 0.000012, 0.871234};
  const std::string pt = "CHECK p_eos rows=32 (held out) positions=40 before=0.000012 after=0.871234";
  EXPECT_EQ(format_check_p_eos(p), pt);
  EXPECT_EQ(parse_check_p_eos_line(pt), p);
  CheckPEosLine pn{8, false, 0, std::nullopt, std::nullopt};
  EXPECT_EQ(format_check_p_eos(pn), "CHECK p_eos rows=8 (seen in training) positions=0 before=n/a after=n/a");
  EXPECT_EQ(parse_check_p_eos_line(format_check_p_eos(pn)), pn);
  EXPECT_FALSE(parse_check_p_eos_line("CHECK p_eos rows=8 (elsewhere) positions=0 before=n/a after=n/a"));

  CheckEvalCeLine c{32, 1234, 1.23456789, 600, 632};
  const std::string ct =
      "CHECK eval_ce rows=32 targets=1234 ce=1.23456789 epoch0_rows=600:632 (the p_eos rows)";
  EXPECT_EQ(format_check_eval_ce(c), ct);
  EXPECT_EQ(parse_check_eval_ce_line(ct), c);
  CheckEvalCeLine cn{4, 0, std::nullopt, 0, 4};
  EXPECT_EQ(parse_check_eval_ce_line(format_check_eval_ce(cn)), cn);
  EXPECT_FALSE(
      parse_check_eval_ce_line("CHECK eval_ce rows=32 targets=1234 ce=1.2 epoch0_rows=600 (the p_eos rows)"));

  CheckStep1CeLine s{1.077855};
  const std::string st = "CHECK step1_ce=1.077855 (compare with a reference forward of the step-1 rows)";
  EXPECT_EQ(format_check_step1_ce(s), st);
  EXPECT_EQ(parse_check_step1_ce_line(st), s);
  EXPECT_FALSE(parse_check_step1_ce_line("CHECK step1_ce=1.077855"));
  EXPECT_FALSE(parse_check_step1_ce_line(pt));
}
