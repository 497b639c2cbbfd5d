#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/bf16.h"

namespace olmosft {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
    case DType::F64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
    case DType::F64:
      return "F64";
  }
  return "?";
}

DType parse_dtype(const std::string& name, const std::string& context) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::F64}) {
    if (name == dtype_name(t)) return t;
  }
  fail(context, ": unsupported dtype '", name, "' (expected one of F32, BF16, F16, I32, I64, U8, F64)");
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

static Shape row_major_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) OLMO_CHECK(d >= 0, "tensor shape ", shape_str(shape), " has a negative size");
  Tensor t;
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  size_t padded = ((bytes + 63) / 64) * 64;
  void* p = std::aligned_alloc(64, padded ? padded : 64);
  OLMO_CHECK(p != nullptr, "out of memory allocating ", bytes, " bytes for tensor ", shape_str(shape));
  t.base_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = row_major_strides(shape);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype) {
  Tensor t;
  t.base_ = std::shared_ptr<void>(data, [](void*) {});
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = row_major_strides(shape);
  return t;
}

int64_t Tensor::size(int dim) const {
  int d = dim < 0 ? dim + ndim() : dim;
  OLMO_CHECK(d >= 0 && d < ndim(), "dimension ", dim, " out of range for shape ", shape_str(shape_));
  return shape_[d];
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

Tensor Tensor::view(const Shape& shape) const {
  OLMO_CHECK(is_contiguous(), "view of a non-contiguous tensor ", shape_str(shape_));
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      OLMO_CHECK(infer < 0, "view: more than one -1 in ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    OLMO_CHECK(known > 0 && numel() % known == 0, "view: cannot infer ", shape_str(shape), " from ",
               shape_str(shape_));
    s[infer] = numel() / known;
  }
  OLMO_CHECK(shape_numel(s) == numel(), "view: ", shape_str(shape_), " has ", numel(), " elements, not the ",
             shape_numel(s), " of ", shape_str(s));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = row_major_strides(s);
  return t;
}

Tensor Tensor::slice(int dim, int64_t start, int64_t end) const {
  int d = dim < 0 ? dim + ndim() : dim;
  OLMO_CHECK(d >= 0 && d < ndim(), "slice: dimension ", dim, " out of range for ", shape_str(shape_));
  OLMO_CHECK(0 <= start && start <= end && end <= shape_[d], "slice [", start, ", ", end,
             ") out of range for dim ", d, " of ", shape_str(shape_));
  Tensor t = *this;
  t.offset_ += static_cast<size_t>(start * strides_[d]) * dtype_size(dtype_);
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int dim, int64_t index) const {
  int d = dim < 0 ? dim + ndim() : dim;
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  int a = d0 < 0 ? d0 + ndim() : d0, b = d1 < 0 ? d1 + ndim() : d1;
  OLMO_CHECK(a >= 0 && a < ndim() && b >= 0 && b < ndim(), "transpose(", d0, ", ", d1, ") out of range for ",
             shape_str(shape_));
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

namespace {
// Calls fn(dst_elem_index_in_contiguous_order, src_byte_offset) over all elements of a strided tensor.
template <typename F>
void for_each_offset(const Shape& shape, const Shape& strides, size_t esize, F&& fn) {
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  int nd = static_cast<int>(shape.size());
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(i, static_cast<size_t>(off) * esize);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

float load_as_f32(const std::byte* p, DType t) {
  switch (t) {
    case DType::F32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::BF16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return bf16_to_f32(v);
    }
    case DType::F16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return f16_to_f32(v);
    }
    case DType::F64: {
      double v;
      std::memcpy(&v, p, 8);
      return static_cast<float>(v);
    }
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return static_cast<float>(v);
    }
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<float>(v);
    }
    case DType::U8:
      return static_cast<float>(static_cast<uint8_t>(*p));
  }
  return 0;
}

double load_as_f64(const std::byte* p, DType t) {
  if (t == DType::F64) {
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  if (t == DType::I64) {
    int64_t v;
    std::memcpy(&v, p, 8);
    return static_cast<double>(v);
  }
  return load_as_f32(p, t);
}

void store_from_f64(std::byte* p, DType t, double x) {
  switch (t) {
    case DType::F32: {
      float v = static_cast<float>(x);
      std::memcpy(p, &v, 4);
      return;
    }
    case DType::BF16: {
      uint16_t v = f32_to_bf16(static_cast<float>(x));
      std::memcpy(p, &v, 2);
      return;
    }
    case DType::F16: {
      uint16_t v = f32_to_f16(static_cast<float>(x));
      std::memcpy(p, &v, 2);
      return;
    }
    case DType::F64: {
      std::memcpy(p, &x, 8);
      return;
    }
    case DType::I32: {
      int32_t v = static_cast<int32_t>(x);
      std::memcpy(p, &v, 4);
      return;
    }
    case DType::I64: {
      int64_t v = static_cast<int64_t>(x);
      std::memcpy(p, &v, 8);
      return;
    }
    case DType::U8: {
      *p = static_cast<std::byte>(static_cast<uint8_t>(x));
      return;
    }
  }
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  OLMO_CHECK(src.shape_ == shape_, "copy_from: shape ", shape_str(src.shape_), " into ", shape_str(shape_));
  if (src.dtype_ == dtype_ && src.is_contiguous() && is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  const auto* s = static_cast<const std::byte*>(src.raw_data());
  auto* d = static_cast<std::byte*>(raw_data());
  if (src.dtype_ == dtype_) {  // same dtype, strided: copy element bytes (exact for every dtype)
    size_t es = dtype_size(dtype_);
    std::vector<std::byte> tmpb(nbytes());
    for_each_offset(src.shape_, src.strides_, es,
                    [&](int64_t i, size_t off) { std::memcpy(&tmpb[i * es], s + off, es); });
    for_each_offset(shape_, strides_, es,
                    [&](int64_t i, size_t off) { std::memcpy(d + off, &tmpb[i * es], es); });
    return;
  }
  // Converting path: gather the source in contiguous order as f64, then scatter into our strides.
  std::vector<double> tmp(static_cast<size_t>(numel()));
  for_each_offset(src.shape_, src.strides_, dtype_size(src.dtype_),
                  [&](int64_t i, size_t off) { tmp[i] = load_as_f64(s + off, src.dtype_); });
  for_each_offset(shape_, strides_, dtype_size(dtype_),
                  [&](int64_t i, size_t off) { store_from_f64(d + off, dtype_, tmp[i]); });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  if (is_contiguous() && dtype_ == DType::F32 && dtype == DType::BF16) {
    f32_to_bf16(data<float>(), static_cast<uint16_t*>(t.raw_data()), static_cast<size_t>(numel()));
  } else if (is_contiguous() && dtype_ == DType::BF16 && dtype == DType::F32) {
    bf16_to_f32(static_cast<const uint16_t*>(raw_data()), t.data<float>(), static_cast<size_t>(numel()));
  } else {
    t.copy_from(*this);
  }
  return t;
}

void Tensor::fill(float value) {
  OLMO_CHECK(dtype_ == DType::F32 && is_contiguous(), "fill: needs a contiguous F32 tensor");
  std::fill_n(data<float>(), numel(), value);
}

void Tensor::zero() {
  OLMO_CHECK(is_contiguous(), "zero: needs a contiguous tensor");
  std::memset(raw_data(), 0, nbytes());
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  OLMO_CHECK(a.shape() == b.shape(), "max_abs_diff: shapes ", shape_str(a.shape()), " vs ",
             shape_str(b.shape()));
  Tensor x = a.to(DType::F64), y = b.to(DType::F64);
  const double *p = x.data<double>(), *q = y.data<double>();
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double d = std::fabs(p[i] - q[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

double max_rel_diff(const Tensor& a, const Tensor& b, double atol) {
  OLMO_CHECK(a.shape() == b.shape(), "max_rel_diff: shapes ", shape_str(a.shape()), " vs ",
             shape_str(b.shape()));
  Tensor x = a.to(DType::F64), y = b.to(DType::F64);
  const double *p = x.data<double>(), *q = y.data<double>();
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double d = std::fabs(p[i] - q[i]) / (std::fabs(q[i]) + atol);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace olmosft
