// Tensor: a dtype, a shape of up to 4 dimensions and a contiguous window into shared,
// byte-accounted storage. Views share storage; nothing here computes (see kernels/).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/allocator.h"
#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom {

const char* device_name(Device d);

class Shape {
 public:
  static constexpr int kMaxDims = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);

  int ndim() const { return n_; }
  int64_t operator[](int i) const { return d_[size_t(i)]; }
  int64_t& operator[](int i) { return d_[size_t(i)]; }
  int64_t numel() const;
  std::vector<int64_t> to_vector() const { return {d_.begin(), d_.begin() + n_}; }
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[4, 256, 768]"

 private:
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
};

// Owns one allocation (or borrows external memory, e.g. a memory-mapped file).
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  MemCategory category = MemCategory::other;
  Device device = Device::cpu;
  Allocator* allocator = nullptr;    // null: borrowed, not freed here
  std::shared_ptr<void> keep_alive;  // for borrowed memory
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype, MemCategory cat = MemCategory::other,
                      Allocator& alloc = cpu_allocator());
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory cat = MemCategory::other,
                      Allocator& alloc = cpu_allocator());
  // Wraps memory owned elsewhere; keep_alive holds its owner.
  static Tensor borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> keep_alive = nullptr);
  template <class T>
  static Tensor from_vector(const std::vector<T>& v, const Shape& shape, MemCategory cat = MemCategory::other);

  bool defined() const { return storage_ != nullptr; }
  // No other tensor (view or copy) shares this one's storage: safe to hand the memory on.
  bool sole_owner() const { return storage_ != nullptr && storage_.use_count() == 1; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t size(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu; }
  MemCategory category() const { return storage_ ? storage_->category : MemCategory::other; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }

  // The data's host address. Refuses a tensor on another device ("[tensor] ... lives on
  // cuda"): its address is a device pointer that host code must not dereference.
  void* raw() const;
  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>(), "tensor");
    return static_cast<T*>(raw());
  }
  // The data's address on the tensor's own device, for device code (CUDA kernels, cuBLAS,
  // NCCL, cudaMemcpy) that knows which device it got.
  void* device_raw() const;
  template <class T>
  T* device_data() const {
    check_dtype(dtype_of<T>(), "tensor");
    return static_cast<T*>(device_raw());
  }

  // Same storage, new shape with the same element count.
  Tensor view(const Shape& shape) const;
  // Same storage: `shape.numel()` elements starting at element `offset`.
  Tensor slice(int64_t offset, const Shape& shape) const;
  // Rows [start, start + len) of dimension 0.
  Tensor narrow0(int64_t start, int64_t len) const;

  Tensor clone(MemCategory cat = MemCategory::other) const;
  void copy_from(const Tensor& src) const;  // same dtype and numel
  void zero() const;
  void fill(double value) const;             // floating dtypes and i32
  std::vector<float> to_f32_vector() const;  // any float dtype

  void check_dtype(DType want, const char* where) const;
  std::string describe() const;  // "f32[4, 256]"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::f32;
};

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& v, const Shape& shape, MemCategory cat) {
  LOOM_CHECK(int64_t(v.size()) == shape.numel(), "tensor", "from_vector: ", v.size(), " values for shape ",
             shape.str());
  Tensor t = empty(shape, dtype_of<T>(), cat);
  if (!v.empty()) std::memcpy(t.raw(), v.data(), v.size() * sizeof(T));
  return t;
}

}  // namespace loom
