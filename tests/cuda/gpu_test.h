// What the GPU tests do without a GPU: skip, naming why, or fail when LOOM_TEST_REQUIRE_GPU=1
// (scripts/gpu-check.sh sets it, since it exists to prove the GPU path and a skip proves
// nothing). Also the host<->device helpers both GPU test binaries use.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/kernels/cuda/cuda_ops.h"

namespace loom::testing {

inline bool gpu_required() {
  const char* v = std::getenv("LOOM_TEST_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// Fixture of every GPU test: its body runs only when a CUDA device is usable.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::available()) return;
    if (gpu_required())
      FAIL() << "[gpu] no usable CUDA device (" << cuda::describe() << ") and LOOM_TEST_REQUIRE_GPU=1";
    GTEST_SKIP() << "[gpu] no usable CUDA device (" << cuda::describe()
                 << "); run scripts/gpu-check.sh on a machine with a GPU";
  }
};

inline Tensor to_device(const Tensor& host, MemCategory cat = MemCategory::other) {
  Tensor d = Tensor::empty(host.shape(), host.dtype(), cat, cuda::allocator());
  cuda::copy(d, host);
  return d;
}

inline Tensor to_host(const Tensor& dev) {
  Tensor h = Tensor::empty(dev.shape(), dev.dtype());
  cuda::copy(h, dev);
  return h;
}

template <class T>
Tensor device_vector(const std::vector<double>& values) {
  std::vector<T> v;
  v.reserve(values.size());
  for (double x : values) v.push_back(from_double<T>(x));
  return to_device(Tensor::from_vector(v, {int64_t(v.size())}));
}

template <class T>
std::vector<double> host_values(const Tensor& dev) {
  Tensor h = to_host(dev);
  std::vector<double> out(size_t(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) out[size_t(i)] = to_double(h.data<T>()[i]);
  return out;
}

}  // namespace loom::testing
