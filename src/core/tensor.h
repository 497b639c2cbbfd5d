// Tensor: a typed, strided view over shared storage. fp32 is the compute type; bf16/fp16 are storage
// formats (checkpoints, export). Shapes are int64, strides are in elements, row-major by default.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace olmosft {

enum class DType { F32, BF16, F16, I32, I64, U8, F64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: F32, BF16, F16, I32, I64, U8, F64
// Parses a safetensors dtype name; `context` names the input for the error message.
DType parse_dtype(const std::string& name, const std::string& context);

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::I32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::I64;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::U8;
  else
    static_assert(sizeof(T) == 0, "no dtype for this C++ type (use uint16_t with raw_data for bf16/f16)");
}

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  // Fresh, 64-byte aligned, zero-filled storage.
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32);
  // Fresh storage, not initialised.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32);
  // A non-owning view over external memory (arena, mmap); the caller keeps the memory alive.
  static Tensor wrap(void* data, const Shape& shape, DType dtype);
  template <typename T>
  static Tensor from(const std::vector<T>& values, const Shape& shape) {
    Tensor t = empty(shape, dtype_of<T>());
    OLMO_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "Tensor::from: ", values.size(),
               " values for shape ", shape_str(shape));
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }

  bool defined() const { return base_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw_data() { return static_cast<std::byte*>(base_.get()) + offset_; }
  const void* raw_data() const { return static_cast<const std::byte*>(base_.get()) + offset_; }
  template <typename T>
  T* data() {
    OLMO_CHECK(dtype_ == dtype_of<T>(), "tensor holds ", dtype_name(dtype_), ", accessed as ",
               dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  const T* data() const {
    OLMO_CHECK(dtype_ == dtype_of<T>(), "tensor holds ", dtype_name(dtype_), ", accessed as ",
               dtype_name(dtype_of<T>()));
    return static_cast<const T*>(raw_data());
  }

  // Views (share storage).
  Tensor view(const Shape& shape) const;                    // contiguous only; one dim may be -1
  Tensor slice(int dim, int64_t start, int64_t end) const;  // [start, end) along dim
  Tensor transpose(int d0, int d1) const;
  Tensor select(int dim, int64_t index) const;  // drops the dim

  // Copies.
  Tensor contiguous() const;          // returns *this when already contiguous
  Tensor clone() const;               // always a fresh contiguous copy
  Tensor to(DType dtype) const;       // conversion (bf16/f16 rounding to nearest even)
  void copy_from(const Tensor& src);  // same shape; converts dtype
  void fill(float value);             // F32 only
  void zero();

 private:
  std::shared_ptr<void> base_;
  size_t offset_ = 0;  // bytes
  DType dtype_ = DType::F32;
  Shape shape_, strides_;
};

// Max |a-b| / (|b| + atol) style comparison helpers for tests and checks.
double max_abs_diff(const Tensor& a, const Tensor& b);
double max_rel_diff(const Tensor& a, const Tensor& b, double atol);

}  // namespace olmosft
