// The training loss as a list of terms, each named once. The model adds each term's micro-batch sum to
// LossParts::sum[term] (where it is computed: ce and lm_z in the LM head's cross-entropy, moe_lb and router_z
// in every MoE layer's router); the trainer reduces each over the step by its Reduction and weights it with
// its recipe key; the LOSS-PARTS line, metrics.jsonl, TensorBoard (`train/<name>`), the trainer's total and
// `k8s watch` iterate over this list. Adding a term: an entry here, and the code that computes its sum.
#pragma once
#include <array>

namespace olmosft::model {

enum LossTermId : int { kLossCe = 0, kLossLmZ, kLossMoeLb, kLossRouterZ, kLossTermCount };

enum class LossReduction {
  // sum over the step's trained targets, times the weight, divided by their count (the runbook's token mean)
  TokenMean,
  // the model adds it already weighted (per MoE layer, summed over layers); the step averages over its leaves
  LeafMean,
};

struct LossTerm {
  const char* name;            // in LOSS-PARTS, metrics.jsonl, TensorBoard ("train/<name>"), steps.jsonl
  const char* weight_key;      // recipe key of its coefficient; nullptr: weight 1
  const char* weight_default;  // that key's default
  const char* weight_doc;      // that key's documentation (`olmosft recipe keys`)
  LossReduction reduction;
};

inline constexpr std::array<LossTerm, kLossTermCount> kLossTerms = {{
    {"ce", nullptr, nullptr, nullptr, LossReduction::TokenMean},
    {"lm_z", "loss.lm_z", "1e-5", "LM-head z-loss coefficient (x mean logsumexp^2 over trained tokens)",
     LossReduction::TokenMean},
    {"moe_lb", "loss.moe_lb", "0.01", "MoE load-balance loss coefficient, per MoE layer, summed",
     LossReduction::LeafMean},
    {"router_z", "loss.router_z", "1e-5", "MoE router z-loss coefficient, per MoE layer, summed",
     LossReduction::LeafMean},
}};

// One value per loss term (sums, weights or the step's values), indexed by LossTermId.
using LossValues = std::array<double, kLossTermCount>;

}  // namespace olmosft::model
