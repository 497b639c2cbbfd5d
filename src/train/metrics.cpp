#include "train/metrics.h"

#include <algorithm>

namespace olmosft::train {

std::vector<std::pair<std::string, float>> tensorboard_scalars(const nlohmann::json& row) {
  auto f = [&](const char* key) { return static_cast<float>(row.at(key).get<double>()); };
  std::vector<std::pair<std::string, float>> v = {{"train/loss", f("loss")},
                                                  {"train/ce", f("ce")},
                                                  {"train/lm_z", f("lm_z")},
                                                  {"train/moe_lb", f("moe_lb")},
                                                  {"train/router_z", f("router_z")},
                                                  {"train/grad_norm", f("grad_norm")},
                                                  {"train/lr", f("lr")},
                                                  {"train/tokens", f("tokens")},
                                                  {"perf/tokens_per_s", f("tokens_per_s")},
                                                  {"perf/step_time", f("step_time")},
                                                  {"perf/mfu", f("mfu")}};
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
