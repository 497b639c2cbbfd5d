#include "model/memory_policy.h"

#include "core/error.h"

namespace olmosft::model {

Remat parse_remat(const std::string& text, const std::string& where) {
  if (text == "none") return Remat::None;
  if (text == "full") return Remat::Full;
  if (text == "attn") return Remat::Attn;
  fail(where, ": expected none, full or attn, got '", text, "'");
}

SavedDtype parse_saved_dtype(const std::string& text, const std::string& where) {
  if (text == "fp32") return SavedDtype::F32;
  if (text == "bf16") return SavedDtype::BF16;
  fail(where, ": expected fp32 or bf16, got '", text, "'");
}

const char* remat_name(Remat r) {
  switch (r) {
    case Remat::None:
      return "none";
    case Remat::Full:
      return "full";
    case Remat::Attn:
      return "attn";
  }
  return "?";
}

const char* saved_dtype_name(SavedDtype s) { return s == SavedDtype::BF16 ? "bf16" : "fp32"; }

}  // namespace olmosft::model
