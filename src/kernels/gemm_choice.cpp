// The CPU GEMM set-up's names and choices (kernels/gemm.h): parsing the recipe's compute.gemm and
// compute.dtype and the `auto` choice. Kept apart from the GEMMs themselves so that readers of recipes (the
// recipe fuzz target) link without OpenBLAS and oneDNN.
#include <string>

#include "core/error.h"
#include "kernels/gemm.h"

namespace olmosft {

GemmLib auto_gemm_lib() {
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return avx512 ? GemmLib::OneDNN : GemmLib::OpenBLAS;
}

GemmLib parse_gemm_lib(const std::string& text, const std::string& where) {
  if (text == "auto") return auto_gemm_lib();
  if (text == "openblas") return GemmLib::OpenBLAS;
  if (text == "onednn") return GemmLib::OneDNN;
  throw Error(where + ": expected auto, openblas or onednn, got '" + text + "'");
}

ComputeDtype parse_compute_dtype(const std::string& text, const std::string& where) {
  if (text == "fp32") return ComputeDtype::F32;
  if (text == "bf16") return ComputeDtype::BF16;
  throw Error(where + ": expected fp32 or bf16, got '" + text + "'");
}

const char* gemm_lib_name(GemmLib l) { return l == GemmLib::OneDNN ? "onednn" : "openblas"; }
const char* compute_dtype_name(ComputeDtype d) { return d == ComputeDtype::BF16 ? "bf16" : "fp32"; }

}  // namespace olmosft
