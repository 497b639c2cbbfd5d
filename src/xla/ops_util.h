// Small helpers shared by the layer-op emitters (ops_*.cpp); not part of their API.
#pragma once
#include <numeric>
#include <vector>

#include "core/error.h"
#include "xla/hlo_builder.h"

namespace olmosft::xla::ops::detail {

constexpr ElementType kF32 = ElementType::kF32;
constexpr ElementType kS32 = ElementType::kS32;
constexpr ElementType kPred = ElementType::kPred;

// A constant of LIKE's type with every element V.
inline Value splat(HloBuilder& b, const Value& like, double v) { return b.constant(like.type(), v); }
// A constant f32 scalar broadcast to DIMS.
inline Value full(HloBuilder& b, const std::vector<int64_t>& dims, double v, ElementType t = kF32) {
  return b.constant(TensorType{t, dims}, v);
}
inline std::vector<int64_t> range(int64_t lo, int64_t hi) {
  std::vector<int64_t> r(size_t(hi > lo ? hi - lo : 0));
  std::iota(r.begin(), r.end(), lo);
  return r;
}
// Broadcasts X to X's type with DIMS: operand dimension i goes to BDIMS[i].
inline Value bcast(HloBuilder& b, const Value& x, const std::vector<int64_t>& dims,
                   const std::vector<int64_t>& bdims) {
  return b.broadcast_in_dim(x, dims, bdims);
}
// Refuses a value that is not of element type T (naming the op and the argument).
inline void expect_type(const Value& v, ElementType t, const char* op, const char* what) {
  OLMO_CHECK(v.type().type == t, "xla ops: ", op, ": ", what, " must be ", mlir_name(t), ", got ",
             v.type().mlir());
}
inline void expect_dims(const Value& v, const std::vector<int64_t>& dims, const char* op, const char* what) {
  OLMO_CHECK(v.type().dims == dims, "xla ops: ", op, ": ", what, " must have dims ", dims_string(dims),
             ", got ", v.type().mlir());
}

}  // namespace olmosft::xla::ops::detail
