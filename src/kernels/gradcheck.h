// Finite-difference gradient checking (float64 central differences) and the per-kernel checks that
// `olmosft selfcheck` prints.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace olmosft {

// Perturbs each x[i] by +-h, evaluates loss() (which must read x), and compares the central difference
// with analytic[i]. Returns max_i |fd_i - analytic_i| / max(max_i |analytic_i|, 1e-12): the error relative
// to the gradient's scale (robust for entries that are ~0). x is restored.
double fd_max_rel_err(const std::function<double()>& loss, double* x, int64_t n, const double* analytic,
                      double h = 1e-5);

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
