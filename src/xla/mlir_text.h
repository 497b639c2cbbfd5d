// Internal to the StableHLO emitter (hlo_builder*.cpp): MLIR text pieces and the dimension-list checks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "xla/types.h"

namespace olmosft::xla::mlir {

std::string i64_array(const std::vector<int64_t>& v);  // array<i64: 1, 2> (array<i64> when empty)
std::string i64_list(const std::vector<int64_t>& v);   // [1, 2]
std::string hex(uint64_t bits, int digits);            // 0x3F80 (upper case, DIGITS hex digits)
// A dense-attribute element of type T: floats as their exact bits in hex, integers in decimal (VALUE must be
// integral and in range), pred as true/false. OP names the op in errors.
std::string literal(ElementType t, double value, const char* op);
// An MLIR string literal: printable ASCII kept, quote, backslash and everything else as \XX.
std::string quoted(const std::string& s);
std::string types_list(const std::vector<TensorType>& ts);  // tensor<2xf32>, tensor<i32>
// Refuses a dimension of DIMS outside T's rank or listed twice; WHAT says which list, OP which op.
void check_dims(const std::vector<int64_t>& dims, const TensorType& t, const char* op, const char* what);

}  // namespace olmosft::xla::mlir
