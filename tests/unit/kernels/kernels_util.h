// Shared helpers for the kernels_*_test.cpp files: golden-fixture loading and comparisons.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"

namespace kt {

inline nlohmann::json load_fixture(const std::string& name) {
  const std::string path = std::string(OLMOSFT_GOLDEN_DIR) + "/kernels/" + name;
  std::ifstream f(path);
  if (!f)
    throw std::runtime_error("cannot open fixture " + path + " (regenerate with scripts/make-fixtures.sh)");
  return nlohmann::json::parse(f);
}

template <typename T>
std::vector<T> vec(const nlohmann::json& j) {
  std::vector<T> v;
  v.reserve(j.size());
  for (const auto& e : j) v.push_back(static_cast<T>(e.get<double>()));
  return v;
}

template <typename A, typename B>
double max_abs(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}
// max |a - b| / max |b|: error relative to the reference's scale.
template <typename A, typename B>
double max_rel(const std::vector<A>& a, const std::vector<B>& b) {
  double s = 0;
  for (auto v : b) s = std::max(s, std::abs(double(v)));
  return max_abs(a, b) / std::max(s, 1e-300);
}

template <typename T>
std::vector<T> randn(size_t n, uint64_t seed, double scale = 1.0) {
  olmosft::Rng r{seed, 1};
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = T(scale * r.normal(i));
  return v;
}
template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace kt
