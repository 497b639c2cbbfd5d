// What the trainer logs per step to TensorBoard, derived from the same metrics.jsonl row it writes, so the
// two logs cannot disagree (tests/unit/io/io_tb_upstream_test.cpp checks TensorBoard's own reader against the
// rows).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace olmosft::train {

// The TensorBoard scalars of one metrics.jsonl row (keys step, loss, ce, lm_z, moe_lb, router_z, grad_norm,
// lr, tokens, tokens_per_s, step_time, mfu, moe_required_buffer_factor [per MoE layer], moe_dropped_tokens
// [per MoE layer]): each value rounded to float, in this order:
//   train/loss ce lm_z moe_lb router_z grad_norm lr tokens, perf/tokens_per_s step_time mfu, and for MoE
//   models (non-empty per-layer arrays) train/moe_required_buffer_factor_max (max over layers) and
//   train/moe_dropped_tokens (sum over layers).
std::vector<std::pair<std::string, float>> tensorboard_scalars(const nlohmann::json& row);

}  // namespace olmosft::train
