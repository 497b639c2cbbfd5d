#include "train/metrics.h"

#include <algorithm>
#include <string>

#include "model/loss_terms.h"

namespace olmosft::train {

std::vector<std::pair<std::string, float>> tensorboard_scalars(const nlohmann::json& row) {
  auto f = [&](const char* key) { return static_cast<float>(row.at(key).get<double>()); };
  std::vector<std::pair<std::string, float>> v = {{"train/loss", f("loss")}};
  for (const model::LossTerm& t : model::kLossTerms) v.push_back({std::string("train/") + t.name, f(t.name)});
  for (const char* k : {"grad_norm", "lr", "tokens"}) v.push_back({std::string("train/") + k, f(k)});
  for (const char* k : {"tokens_per_s", "step_time", "mfu"}) v.push_back({std::string("perf/") + k, f(k)});
  const auto& rbf = row.at("moe_required_buffer_factor");
  const auto& dropped = row.at("moe_dropped_tokens");
  if (!rbf.empty()) {
    double max_rbf = 0;
    for (const auto& x : rbf) max_rbf = std::max(max_rbf, x.get<double>());
    int64_t total = 0;
    for (const auto& x : dropped) total += x.get<int64_t>();
    v.push_back({"train/moe_required_buffer_factor_max", static_cast<float>(max_rbf)});
    v.push_back({"train/moe_dropped_tokens", static_cast<float>(total)});
  }
  return v;
}

}  // namespace olmosft::train
