// Element types and array shapes shared by the PJRT runtime (pjrt.h) and the StableHLO emitter
// (hlo_builder.h). Dimensions are major-to-minor (row-major), like the rest of olmosft.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace olmosft::xla {

enum class ElementType : uint8_t { kPred, kS32, kS64, kBF16, kF32, kF64, kU8 };

// Bytes per element on the host (kPred: one byte, 0 or 1).
size_t element_bytes(ElementType t);
// The MLIR spelling: i1, i32, i64, bf16, f32, f64, ui8 (kU8: bytes, e.g. a custom call's workspace).
std::string_view mlir_name(ElementType t);
bool is_float(ElementType t);
bool is_integer(ElementType t);  // kS32, kS64 (not kPred)

// A typed array shape: element type + dimensions (empty for a scalar).
struct TensorType {
  ElementType type = ElementType::kF32;
  std::vector<int64_t> dims;

  int64_t rank() const { return static_cast<int64_t>(dims.size()); }
  int64_t elements() const;
  size_t bytes() const { return static_cast<size_t>(elements()) * element_bytes(type); }
  // MLIR spelling, e.g. tensor<4x8xf32>, tensor<f32> for a scalar.
  std::string mlir() const;
  bool operator==(const TensorType&) const = default;
};

// "[4, 8]" for messages.
std::string dims_string(std::span<const int64_t> dims);

}  // namespace olmosft::xla
