// Device memory through loom's Tensor: copies host<->device<->device byte for byte, the CUDA
// allocator's accounting, and host code refused a device tensor's data. Without a GPU every
// test skips (gpu_test.h).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>

#include "cuda/gpu_test.h"
#include "loom/kernels/ops.h"
#include "testing/errors.h"

using namespace loom;
using loom::testing::error_of;
using loom::testing::GpuTest;
using loom::testing::to_device;
using loom::testing::to_host;

namespace {

// Bytes that differ at every position, so a shifted or partial copy shows.
Tensor patterned(int64_t n, DType dtype, uint8_t seed) {
  Tensor t = Tensor::empty({n}, dtype);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(seed + i * 131 + (i >> 8));
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

}  // namespace

using CudaDevice = GpuTest;
using CudaCopy = GpuTest;
using CudaAllocator = GpuTest;

TEST_F(CudaDevice, DescribesTheDevice) {
  const std::string d = cuda::describe();
  EXPECT_EQ(d.rfind("cuda: ", 0), 0u) << d;
  EXPECT_NE(d.find("sm_"), std::string::npos) << d;
}

TEST_F(CudaCopy, RoundTripsEveryDtypeAndSize) {
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                          DType::i32, DType::i64, DType::i8,   DType::u8};
  const int64_t sizes[] = {0, 1, 3, 1000, 4097, (int64_t(1) << 20) + 1};
  for (DType dt : dtypes)
    for (int64_t n : sizes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + "[" + std::to_string(n) + "]");
      Tensor host = patterned(n, dt, uint8_t(n));
      Tensor dev = to_device(host);
      EXPECT_EQ(dev.device(), Device::cuda);
      Tensor dev2 = Tensor::empty(host.shape(), dt, MemCategory::other, cuda::allocator());
      cuda::copy(dev2, dev);  // device to device
      EXPECT_TRUE(same_bytes(to_host(dev2), host));
      Tensor host2 = Tensor::empty(host.shape(), dt);
      cuda::copy(host2, host);  // host to host goes through cudaMemcpy too
      EXPECT_TRUE(same_bytes(host2, host));
    }
}

// Views and slices of a device tensor address its storage at their offset.
TEST_F(CudaCopy, IntoAndOutOfSlices) {
  Tensor whole_host = patterned(100, DType::f32, 1);
  Tensor whole = to_device(whole_host);
  Tensor piece = patterned(7, DType::f32, 99);
  cuda::copy(whole.slice(5, {7}), piece);
  Tensor back = to_host(whole);
  for (int64_t i = 0; i < 100; ++i) {
    const float want = (i >= 5 && i < 12) ? piece.data<float>()[i - 5] : whole_host.data<float>()[i];
    EXPECT_EQ(std::memcmp(&back.data<float>()[i], &want, 4), 0) << "element " << i;
  }
  Tensor rows = to_host(whole.view({10, 10}).narrow0(3, 2));
  EXPECT_EQ(std::memcmp(rows.raw(), back.data<float>() + 30, 20 * 4), 0);
}

TEST_F(CudaCopy, RefusesDifferentSizes) {
  Tensor dev = Tensor::empty({4}, DType::f32, MemCategory::other, cuda::allocator());
  std::string e = error_of([&] { cuda::copy(dev, Tensor::empty({5}, DType::f32)); });
  EXPECT_NE(e.find("[cuda] copy of f32[5] into f32[4]"), std::string::npos) << e;
}

TEST_F(CudaAllocator, AllocatesDeviceMemoryAndAccountsIt) {
  Allocator& a = cuda::allocator();
  EXPECT_STREQ(a.device_name(), "cuda");
  EXPECT_EQ(a.device(), Device::cuda);
  const MemorySnapshot before = a.snapshot();
  {
    Tensor t = Tensor::empty({1000, 3}, DType::f32, MemCategory::activations, a);
    Tensor g = Tensor::empty({5}, DType::bf16, MemCategory::grads, a);
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, t.device_raw()), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    const MemorySnapshot during = a.snapshot();
    EXPECT_EQ(during[MemCategory::activations].current - before[MemCategory::activations].current, 12000);
    EXPECT_EQ(during[MemCategory::grads].current - before[MemCategory::grads].current, 10);
    EXPECT_EQ(during.total.current - before.total.current, 12010);
    EXPECT_GE(during.total.peak, during.total.current);
    Tensor view = t.view({3000});  // shares storage: no new bytes
    EXPECT_EQ(a.snapshot().total.current, during.total.current);
  }
  const MemorySnapshot after = a.snapshot();
  EXPECT_EQ(after.total.current, before.total.current);
  EXPECT_EQ(after[MemCategory::activations].current, before[MemCategory::activations].current);
  EXPECT_GE(after.total.peak, before.total.current + 12010);
  EXPECT_EQ(memory_stats(a)["allocated_bytes.all.current"], after.total.current);
}

// Host code gets a clear error for a device tensor's data instead of a device pointer it
// would crash on; device code still gets the pointer.
TEST_F(CudaDevice, HostAccessToADeviceTensorIsRefused) {
  Tensor t = to_device(Tensor::from_vector<float>({1, 2, 3}, {3}));
  for (auto* access : {+[](const Tensor& x) { (void)x.data<float>(); }, +[](const Tensor& x) { (void)x.raw(); },
                       +[](const Tensor& x) { (void)x.to_f32_vector(); }, +[](const Tensor& x) { x.fill(1.0); }}) {
    std::string e = error_of([&] { access(t); });
    EXPECT_NE(e.find("[tensor] f32[3] lives on cuda"), std::string::npos) << e;
  }
  std::string e = error_of([&] { (void)t.clone(); });
  EXPECT_NE(e.find("use cuda::copy"), std::string::npos) << e;
  e = error_of([&] { Tensor::empty({3}, DType::f32).copy_from(t); });
  EXPECT_NE(e.find("use cuda::copy"), std::string::npos) << e;
  e = error_of([&] { t.zero(); });
  EXPECT_NE(e.find("[tensor] zero() on f32[3] on cuda; copy zeros from a host tensor with cuda::copy"),
            std::string::npos)
      << e;
  EXPECT_NE(t.device_data<float>(), nullptr);
}

// An op without a CUDA kernel refuses device tensors with the same error instead of
// reading device memory on the host.
TEST_F(CudaDevice, OpsWithoutADeviceKernelRefuseDeviceTensors) {
  Tensor a = to_device(Tensor::from_vector<float>({1, 2}, {2}));
  Tensor b = to_device(Tensor::from_vector<float>({3, 4}, {2}));
  Tensor out = Tensor::empty({2}, DType::f32, MemCategory::other, cuda::allocator());
  std::string e = error_of([&] { ops::add_forward(a, b, out); });
  EXPECT_NE(e.find("lives on cuda"), std::string::npos) << e;
}
