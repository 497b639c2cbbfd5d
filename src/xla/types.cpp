#include "xla/types.h"

#include "core/error.h"

namespace olmosft::xla {

size_t element_bytes(ElementType t) {
  switch (t) {
    case ElementType::kPred:
      return 1;
    case ElementType::kS32:
      return 4;
    case ElementType::kS64:
      return 8;
    case ElementType::kBF16:
      return 2;
    case ElementType::kF32:
      return 4;
    case ElementType::kF64:
      return 8;
    case ElementType::kU8:
      return 1;
  }
  fail("xla: unknown element type ", int(t));
}

std::string_view mlir_name(ElementType t) {
  switch (t) {
    case ElementType::kPred:
      return "i1";
    case ElementType::kS32:
      return "i32";
    case ElementType::kS64:
      return "i64";
    case ElementType::kBF16:
      return "bf16";
    case ElementType::kF32:
      return "f32";
    case ElementType::kF64:
      return "f64";
    case ElementType::kU8:
      return "ui8";
  }
  fail("xla: unknown element type ", int(t));
}

bool is_float(ElementType t) {
  return t == ElementType::kBF16 || t == ElementType::kF32 || t == ElementType::kF64;
}

bool is_integer(ElementType t) { return t == ElementType::kS32 || t == ElementType::kS64; }

int64_t TensorType::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) {
    OLMO_CHECK(d >= 0, "xla: negative dimension in shape ", dims_string(dims));
    n *= d;
  }
  return n;
}

std::string TensorType::mlir() const {
  std::string s = "tensor<";
  for (int64_t d : dims) s += std::to_string(d) + "x";
  s += mlir_name(type);
  return s + ">";
}

std::string dims_string(std::span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace olmosft::xla
