// Finite-difference gradient checking (float64 central differences) and the per-kernel checks that
// `olmosft selfcheck` prints.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace olmosft {

// Central differences (loss(x + h e_i) - loss(x - h e_i)) / 2h for every x[i]; loss() must read x, which is
// perturbed in place and restored.
std::vector<double> fd_gradient(const std::function<double()>& loss, double* x, int64_t n, double h = 1e-5);

// Compares fd_gradient with analytic[i]. Returns max_i |fd_i - analytic_i| / max(max_i |analytic_i|, floor):
// the error relative to the gradient's scale (robust for entries that are ~0). x is restored.
double fd_max_rel_err(const std::function<double()>& loss, double* x, int64_t n, const double* analytic,
                      double h = 1e-5, double floor = 1e-12);

struct KernelCheck {
  std::string name;
  double max_rel_err = 0;  // measured
  double tolerance = 0;    // pass threshold
  std::string detail;      // shapes and what was checked
  bool ok() const { return max_rel_err <= tolerance; }
};

// Runs every kernel's forward and backward in float64 on small random inputs (fixed seeds) and compares
// the analytic gradients (all inputs: activations and weights) with central finite differences.
std::vector<KernelCheck> kernel_gradchecks();

}  // namespace olmosft
