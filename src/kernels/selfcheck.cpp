#include "kernels/selfcheck.h"

#include <algorithm>
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

// Max relative error (against the largest |reference|) of one 37x29x53 GEMM (A^T B^T, beta 1) on `g`,
// against float64 sums of the operands as that set-up sees them (bf16-rounded under BF16 compute).
double gemm_setup_error(const CpuGemm& g) {
  const int64_t M = 37, N = 29, K = 53;
  std::vector<float> A(static_cast<size_t>(K * M)), B(static_cast<size_t>(N * K)),
      C(static_cast<size_t>(M * N));
  const Rng rng{11, 0};
  uint64_t i = 0;
  for (auto* v : {&A, &B, &C})
    for (float& x : *v) x = rng.normal(i++);
  const bool bf16 = g.compute == ComputeDtype::BF16;
  auto seen = [bf16](float x) { return bf16 ? double(bf16_to_f32(f32_to_bf16(x))) : double(x); };
  std::vector<double> ref(C.size());
  double scale = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = C[static_cast<size_t>(i * N + j)];
      for (int64_t k = 0; k < K; ++k)
        s += seen(A[static_cast<size_t>(k * M + i)]) * seen(B[static_cast<size_t>(j * K + k)]);
      ref[static_cast<size_t>(i * N + j)] = s;
      scale = std::max(scale, std::fabs(s));
    }
  {
    ScopedCpuGemm use(g);
    gemm_compute<float>(Precision::Compute, Trans::T, Trans::T, M, N, K, 1.0f, A.data(), M, B.data(), K, 1.0f,
                        C.data(), N);
  }
  double err = 0;
  for (size_t i = 0; i < C.size(); ++i) err = std::max(err, std::fabs(C[i] - ref[i]) / scale);
  return err;
}

std::vector<Check> core_checks() {
  std::vector<Check> c;
  c.push_back({"gemm set-ups vs float64", [](bool& ok) {
                 // fp32 accumulation of 53 products: well under 1e-5 of the largest value.
                 std::ostringstream d;
                 d << std::scientific << std::setprecision(2);
                 ok = true;
                 for (GemmLib lib : {GemmLib::OpenBLAS, GemmLib::OneDNN}) {
                   const double e = gemm_setup_error({lib, ComputeDtype::F32});
                   ok = ok && e < 1e-5;
                   d << gemm_lib_name(lib) << "=" << e << " ";
                 }
                 std::string why;
                 if (onednn_bf16_supported(&why)) {
                   const double e = gemm_setup_error({GemmLib::OpenBLAS, ComputeDtype::BF16});
                   ok = ok && e < 1e-5;
                   d << "bf16=" << e << " (operands rounded first)";
                 } else {
                   d << "bf16 unsupported here: " << why;
                 }
                 return d.str();
               }});
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
  out << "SELFCHECK INFO GEMM: " << gemm_description() << "\n";
  if (const std::string hint = blas_core_hint(); !hint.empty()) out << "SELFCHECK INFO " << hint << "\n";
  out << "SELFCHECK threads=" << num_threads() << " omp_wait_policy=" << omp_wait_policy() << "\n";
  out << "SELFCHECK " << (all ? "all passed" : "FAILED") << "\n";
  return all;
}

}  // namespace olmosft
