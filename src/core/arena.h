// Arena: one aligned block for per-step activations. alloc() bumps a pointer; reset() frees everything
// at once. The high-water mark tells how much a step needed, so the next run can size it exactly.
#pragma once
#include <cstddef>
#include <memory>

#include "core/tensor.h"

namespace olmosft {

class Arena {
 public:
  explicit Arena(size_t capacity_bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* alloc_bytes(size_t bytes);                             // 64-byte aligned; throws when full
  Tensor alloc(const Shape& shape, DType dtype = DType::F32);  // uninitialised view into the arena
  Tensor zeros(const Shape& shape, DType dtype = DType::F32);
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }

 private:
  std::byte* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0;
};

}  // namespace olmosft
