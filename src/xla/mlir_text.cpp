#include "xla/mlir_text.h"

#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "core/error.h"

namespace olmosft::xla::mlir {

std::string i64_array(const std::vector<int64_t>& v) {
  std::string s = "array<i64";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : ": ") + std::to_string(v[i]);
  return s + ">";
}

std::string i64_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string hex(uint64_t bits, int digits) {
  static const char* const d = "0123456789ABCDEF";
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += d[(bits >> (4 * i)) & 0xF];
  return s;
}

std::string literal(ElementType t, double value, const char* op) {
  switch (t) {
    case ElementType::kF64: {
      uint64_t b;
      std::memcpy(&b, &value, 8);
      return hex(b, 16);
    }
    case ElementType::kF32:
      return hex(f32_bits(static_cast<float>(value)), 8);
    case ElementType::kBF16:
      return hex(f32_to_bf16(static_cast<float>(value)), 4);
    case ElementType::kPred:
      OLMO_CHECK(value == 0 || value == 1, "hlo_builder: ", op, ": a pred constant is 0 or 1, got ", value);
      return value != 0 ? "true" : "false";
    case ElementType::kU8:
      OLMO_CHECK(std::nearbyint(value) == value && value >= 0 && value < 256, "hlo_builder: ", op, ": ",
                 value, " is not a ui8 value");
      return std::to_string(static_cast<int64_t>(value));
    case ElementType::kS32:
    case ElementType::kS64: {
      const double lo = t == ElementType::kS32 ? -2147483648.0 : -9223372036854775808.0;
      OLMO_CHECK(std::nearbyint(value) == value && value >= lo && value < -lo, "hlo_builder: ", op, ": ",
                 value, " is not a ", mlir_name(t), " value");
      return std::to_string(static_cast<int64_t>(value));
    }
  }
  fail("hlo_builder: unknown element type");
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
      out += static_cast<char>(c);
    else
      out += "\\" + hex(c, 2).substr(2);
  }
  return out + "\"";
}

std::string types_list(const std::vector<TensorType>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + ts[i].mlir();
  return s;
}

void check_dims(const std::vector<int64_t>& dims, const TensorType& t, const char* op, const char* what) {
  std::vector<bool> seen(static_cast<size_t>(t.rank()), false);
  for (int64_t d : dims) {
    OLMO_CHECK(d >= 0 && d < t.rank(), "hlo_builder: ", op, ": ", what, " dimension ", d,
               " out of range for ", t.mlir());
    OLMO_CHECK(!seen[size_t(d)], "hlo_builder: ", op, ": ", what, " dimension ", d, " listed twice for ",
               t.mlir());
    seen[size_t(d)] = true;
  }
}

}  // namespace olmosft::xla::mlir
