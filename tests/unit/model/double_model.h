// A model's weights and gradients as float64 vectors in registry order, for decoder_run<double> (the
// finite-difference and float64 oracle tests of both hybrids).
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.h"

namespace olmosft::testutil {

struct DoubleModel {
  model::ModelConfig config;
  std::vector<std::string> names;
  std::vector<std::vector<double>> w, g;
  std::vector<const double*> wp() const {
    std::vector<const double*> v;
    for (const auto& x : w) v.push_back(x.data());
    return v;
  }
  std::vector<double*> gp() {
    std::vector<double*> v;
    for (auto& x : g) v.push_back(x.data());
    return v;
  }
  int index(const std::string& n) const {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == n) return static_cast<int>(i);
    throw std::runtime_error("no parameter " + n);
  }
  void zero_grads() {
    for (auto& x : g) std::fill(x.begin(), x.end(), 0.0);
  }
};

}  // namespace olmosft::testutil
