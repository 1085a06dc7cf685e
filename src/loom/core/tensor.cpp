#include "loom/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace loom {

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

Shape::Shape(std::initializer_list<int64_t> dims) {
  LOOM_CHECK(dims.size() <= size_t(kMaxDims), "shape", "at most ", kMaxDims, " dimensions, got ", dims.size());
  for (int64_t d : dims) {
    LOOM_CHECK(d >= 0, "shape", "negative dimension ", d);
    d_[size_t(n_++)] = d;
  }
}

Shape::Shape(const std::vector<int64_t>& dims) {
  LOOM_CHECK(dims.size() <= size_t(kMaxDims), "shape", "at most ", kMaxDims, " dimensions, got ", dims.size());
  for (int64_t d : dims) {
    LOOM_CHECK(d >= 0, "shape", "negative dimension ", d);
    d_[size_t(n_++)] = d;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < n_; ++i) n *= d_[size_t(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (n_ != o.n_) return false;
  for (int i = 0; i < n_; ++i)
    if (d_[size_t(i)] != o.d_[size_t(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < n_; ++i) os << (i ? ", " : "") << d_[size_t(i)];
  os << "]";
  return os.str();
}

Storage::~Storage() {
  if (allocator) allocator->deallocate(data, bytes, category);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory cat, Allocator& alloc) {
  Tensor t;
  auto st = std::make_shared<Storage>();
  st->bytes = size_t(shape.numel()) * dtype_size(dtype);
  st->data = alloc.allocate(st->bytes, cat);
  st->category = cat;
  st->device = alloc.device();
  st->allocator = &alloc;
  t.storage_ = std::move(st);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory cat, Allocator& alloc) {
  Tensor t = empty(shape, dtype, cat, alloc);
  t.zero();
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> keep) {
  Tensor t;
  auto st = std::make_shared<Storage>();
  st->data = data;
  st->bytes = size_t(shape.numel()) * dtype_size(dtype);
  st->keep_alive = std::move(keep);
  t.storage_ = std::move(st);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::size(int i) const {
  int n = shape_.ndim();
  if (i < 0) i += n;
  LOOM_CHECK(i >= 0 && i < n, "tensor", "dimension ", i, " out of range for ", describe());
  return shape_[i];
}

void* Tensor::raw() const {
  LOOM_CHECK(storage_, "tensor", "use of an undefined tensor");
  LOOM_CHECK(storage_->device == Device::cpu, "tensor", describe(), " lives on ", device_name(storage_->device),
             "; host code cannot read it: copy it to the CPU first (device code uses device_data)");
  return static_cast<char*>(storage_->data) + offset_;
}

void* Tensor::device_raw() const {
  LOOM_CHECK(storage_, "tensor", "use of an undefined tensor");
  return static_cast<char*>(storage_->data) + offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  LOOM_CHECK(shape.numel() == numel(), "view", "cannot view ", describe(), " as ", shape.str(), " (", numel(), " vs ",
             shape.numel(), " elements)");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(int64_t offset, const Shape& shape) const {
  LOOM_CHECK(offset >= 0 && offset + shape.numel() <= numel(), "slice", "elements [", offset, ", ",
             offset + shape.numel(), ") out of range for ", describe());
  Tensor t = *this;
  t.offset_ += size_t(offset) * dtype_size(dtype_);
  t.shape_ = shape;
  return t;
}

Tensor Tensor::narrow0(int64_t start, int64_t len) const {
  LOOM_CHECK(ndim() >= 1 && start >= 0 && len >= 0 && start + len <= shape_[0], "narrow", "rows [", start, ", ",
             start + len, ") out of range for ", describe());
  Shape s = shape_;
  s[0] = len;
  int64_t row = ndim() ? numel() / std::max<int64_t>(shape_[0], 1) : 1;
  return slice(start * row, s);
}

Tensor Tensor::clone(MemCategory cat) const {
  Tensor t = empty(shape_, dtype_, cat);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) const {
  LOOM_CHECK(device() == Device::cpu && src.device() == Device::cpu, "copy",
             "host copy of a device tensor; use cuda::copy for ", src.describe(), " -> ", describe());
  LOOM_CHECK(src.dtype() == dtype_ && src.numel() == numel(), "copy", "cannot copy ", src.describe(), " into ",
             describe());
  if (nbytes()) std::memmove(raw(), src.raw(), nbytes());
}

void Tensor::zero() const {
  LOOM_CHECK(device() == Device::cpu, "tensor", "zero() on ", describe(), " on ", device_name(device()),
             "; copy zeros from a host tensor with cuda::copy");
  if (nbytes()) std::memset(raw(), 0, nbytes());
}

void Tensor::fill(double value) const {
  const size_t n = size_t(numel());
  switch (dtype_) {
    case DType::f32: std::fill_n(data<float>(), n, float(value)); break;
    case DType::f64: std::fill_n(data<double>(), n, value); break;
    case DType::i32: std::fill_n(data<int32_t>(), n, int32_t(value)); break;
    case DType::bf16: std::fill_n(data<bf16_t>(), n, f32_to_bf16(float(value))); break;
    case DType::f16: std::fill_n(data<f16_t>(), n, f32_to_f16(float(value))); break;
    default: fail("fill", "unsupported dtype ", dtype_name(dtype_));
  }
}

std::vector<float> Tensor::to_f32_vector() const {
  int64_t n = numel();
  std::vector<float> out(static_cast<size_t>(n));
  switch (dtype_) {
    case DType::f32: std::memcpy(out.data(), raw(), size_t(n) * 4); break;
    case DType::f64:
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = float(data<double>()[i]);
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = bf16_to_f32(data<bf16_t>()[i]);
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = f16_to_f32(data<f16_t>()[i]);
      break;
    default: fail("tensor", "to_f32_vector: ", dtype_name(dtype_), " is not a float dtype");
  }
  return out;
}

void Tensor::check_dtype(DType want, const char* where) const {
  LOOM_CHECK(dtype_ == want, where, "expected dtype ", dtype_name(want), ", got ", describe());
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + shape_.str(); }

}  // namespace loom
