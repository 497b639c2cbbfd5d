#include "core/arena.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace olmosft {

Arena::Arena(size_t capacity_bytes) : capacity_(((capacity_bytes + 63) / 64) * 64) {
  base_ = static_cast<std::byte*>(std::aligned_alloc(64, capacity_ ? capacity_ : 64));
  OLMO_CHECK(base_ != nullptr, "arena: cannot allocate ", capacity_bytes, " bytes");
}

Arena::~Arena() { std::free(base_); }

void* Arena::alloc_bytes(size_t bytes) {
  size_t need = ((bytes + 63) / 64) * 64;
  OLMO_CHECK(used_ + need <= capacity_, "arena: out of space: ", used_, " of ", capacity_, " bytes used, ",
             bytes, " more requested (raise the arena size)");
  void* p = base_ + used_;
  used_ += need;
  high_water_ = std::max(high_water_, used_);
  return p;
}

Tensor Arena::alloc(const Shape& shape, DType dtype) {
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor::wrap(alloc_bytes(bytes), shape, dtype);
}

Tensor Arena::zeros(const Shape& shape, DType dtype) {
  Tensor t = alloc(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

}  // namespace olmosft
