#include "kernels/selfcheck.h"

#include <cmath>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/rng.h"
#include "core/threads.h"
#include "kernels/gemm.h"
#include "kernels/gradcheck.h"

namespace olmosft {

namespace {
struct Check {
  std::string name;
  std::function<std::string(bool&)> run;  // sets ok; returns a detail string
};

std::vector<Check> core_checks() {
  std::vector<Check> c;
  c.push_back({"bf16 round-to-nearest-even", [](bool& ok) {
                 // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0); 1 + 3*2^-8 rounds up.
                 ok = f32_to_bf16(1.0f + 0x1.0p-8f) == 0x3f80 &&
                      f32_to_bf16(1.0f + 3 * 0x1.0p-8f) == 0x3f82 &&
                      std::isnan(bf16_to_f32(f32_to_bf16(NAN))) &&
                      bf16_to_f32(f32_to_bf16(INFINITY)) == INFINITY;
                 return std::string("ties, NaN, inf");
               }});
  c.push_back({"rng independent of threads", [](bool& ok) {
                 Tensor a = Tensor::empty({4099}), b = Tensor::empty({4099});
                 int saved = num_threads();
                 set_threads(1);
                 fill_normal(a, Rng{7, 3}, 0.f, 1.f);
                 set_threads(2);
                 fill_normal(b, Rng{7, 3}, 0.f, 1.f);
                 set_threads(saved);
                 ok = max_abs_diff(a, b) == 0.0;
                 return std::string("4099 normals, 1 vs 2 threads");
               }});
  return c;
}
}  // namespace

bool kernel_selfcheck(std::ostream& out) {
  bool all = true;
  for (auto& c : core_checks()) {
    bool ok = false;
    std::string detail = c.run(ok);
    out << "SELFCHECK " << (ok ? "PASS " : "FAIL ") << std::left << std::setw(36) << c.name << " " << detail
        << "\n";
    all = all && ok;
  }
  // One line per kernel: the measured max relative error of the float64 analytic gradient against
  // central finite differences (see kernels/gradcheck.cpp for shapes and tolerances).
  for (const KernelCheck& k : kernel_gradchecks()) {
    std::ostringstream err;
    err << std::scientific << std::setprecision(2) << k.max_rel_err;
    out << "SELFCHECK " << (k.ok() ? "PASS " : "FAIL ") << std::left << std::setw(36) << k.name
        << " max_rel_err=" << err.str() << " (tol " << std::setprecision(0) << std::scientific << k.tolerance
        << std::defaultfloat << ") " << k.detail << "\n";
    all = all && k.ok();
  }
  out << "SELFCHECK INFO BLAS: " << blas_description() << "\n";
  if (const std::string hint = blas_core_hint(); !hint.empty()) out << "SELFCHECK INFO " << hint << "\n";
  out << "SELFCHECK threads=" << num_threads() << " omp_wait_policy=" << omp_wait_policy() << "\n";
  out << "SELFCHECK " << (all ? "all passed" : "FAILED") << "\n";
  return all;
}

}  // namespace olmosft
