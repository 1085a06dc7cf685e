#include <gtest/gtest.h>

#include <cmath>

#include "loom/core/allocator.h"
#include "loom/core/rng.h"
#include "loom/core/tensor.h"

using namespace loom;

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 6}, DType::f32);
  Tensor row = t.narrow0(2, 1).view({6});
  row.data<float>()[3] = 5.0f;
  EXPECT_EQ(t.data<float>()[2 * 6 + 3], 5.0f);
  Tensor s = t.slice(7, {2, 2});
  EXPECT_EQ(s.shape(), Shape({2, 2}));
  EXPECT_EQ(s.data<float>() - t.data<float>(), 7);
}

TEST(Tensor, BadViewsNameTheShapes) {
  Tensor t = Tensor::zeros({4, 6}, DType::f32);
  try {
    t.view({5, 5});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[view]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[5, 5]"), std::string::npos);
  }
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(t.slice(20, {2, 3}), Error);
  EXPECT_THROW(Shape({1, 2, 3, 4, 5}), Error);
}

TEST(Allocator, CountsPerCategoryAndPeak) {
  CpuAllocator a;
  {
    Tensor p = Tensor::empty({1000}, DType::f32, MemCategory::params, a);
    EXPECT_EQ(uintptr_t(p.raw()) % 64, 0u);
    {
      Tensor g = Tensor::empty({500}, DType::f64, MemCategory::grads, a);
      auto s = memory_stats(a);
      EXPECT_EQ(s["params.current"], 4000);
      EXPECT_EQ(s["grads.current"], 4000);
      EXPECT_EQ(s["allocated_bytes.all.current"], 8000);
    }
    auto s = memory_stats(a);
    EXPECT_EQ(s["grads.current"], 0);
    EXPECT_EQ(s["grads.peak"], 4000);
    EXPECT_EQ(s["allocated_bytes.all.peak"], 8000);
  }
  EXPECT_EQ(memory_stats(a)["allocated_bytes.all.current"], 0);
  a.reset_peaks();
  EXPECT_EQ(memory_stats(a)["allocated_bytes.all.peak"], 0);
}

TEST(DType, HalfConversionsRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.1f}) {
    float h = f16_to_f32(f32_to_f16(f));
    EXPECT_NEAR(h, f, std::abs(f) * 1e-3 + 1e-7) << f;
    float b = bf16_to_f32(f32_to_bf16(f));
    EXPECT_NEAR(b, f, std::abs(f) * 8e-3 + 1e-30) << f;
  }
  EXPECT_EQ(f32_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
}

TEST(Rng, PhiloxKnownAnswer) {
  // Random123 known-answer test for philox4x32-10 with counter and key all ones bits.
  auto r = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r[0], 0x408f276du);
  EXPECT_EQ(r[1], 0x41c83b0eu);
  EXPECT_EQ(r[2], 0xa20bc7c6u);
  EXPECT_EQ(r[3], 0x6d5451fdu);
  auto z = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(z[0], 0x6627e8d5u);
  EXPECT_EQ(z[1], 0xe169c58du);
  EXPECT_EQ(z[2], 0xbc57ac4cu);
  EXPECT_EQ(z[3], 0x9b00dbd8u);
}

TEST(Rng, ValuesDependOnlyOnIndexNotOnSharding) {
  std::vector<float> whole(1000), a(400), b(600);
  fill_normal(whole.data(), 1000, 7, hash_name("h.0.attn.c_attn.weight"), 0, 0.f, 0.02f);
  fill_normal(a.data(), 400, 7, hash_name("h.0.attn.c_attn.weight"), 0, 0.f, 0.02f);
  fill_normal(b.data(), 600, 7, hash_name("h.0.attn.c_attn.weight"), 400, 0.f, 0.02f);
  for (int i = 0; i < 400; ++i) EXPECT_EQ(whole[size_t(i)], a[size_t(i)]);
  for (int i = 0; i < 600; ++i) EXPECT_EQ(whole[size_t(400 + i)], b[size_t(i)]);
  double s = 0, ss = 0;
  for (float v : whole) {
    s += v;
    ss += double(v) * v;
  }
  EXPECT_NEAR(s / 1000, 0.0, 0.003);
  EXPECT_NEAR(std::sqrt(ss / 1000), 0.02, 0.002);
}

// Host memory that says it is a GPU's, so a CPU-only build can check the device guard.
class PretendCudaAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemCategory) override { return ::operator new(bytes); }
  void deallocate(void* p, size_t, MemCategory) override { ::operator delete(p); }
  const char* device_name() const override { return "pretend-cuda"; }
  Device device() const override { return Device::cuda; }
};

TEST(Tensor, HostAccessToADeviceTensorIsRefused) {
  PretendCudaAllocator gpu;
  Tensor t = Tensor::empty({2, 3}, DType::f32, MemCategory::other, gpu);
  EXPECT_EQ(t.device(), Device::cuda);
  try {
    (void)t.data<float>();
    ADD_FAILURE() << "data<float>() gave a host pointer to a cuda tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lives on cuda"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)t.raw(), Error);
  try {
    t.zero();
    ADD_FAILURE() << "zero() wrote through a cuda tensor's pointer on the host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("copy zeros from a host tensor with cuda::copy"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(t.device_data<float>(), nullptr);           // device code gets its pointer
  EXPECT_THROW((void)t.device_data<int32_t>(), Error);  // the dtype is still checked
  Tensor host = Tensor::zeros({2}, DType::f32);
  EXPECT_EQ(host.data<float>(), host.device_data<float>());
}
