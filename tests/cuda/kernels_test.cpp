// The CUDA kernels (cuda_ops.h) against loom's CPU kernels through ops::, on shapes from one
// element to block-boundary and odd sizes, with tolerances derived from FP32 rounding (below).
// Without a GPU every test skips (gpu_test.h).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "cuda/gpu_test.h"
#include "loom/core/rng.h"
#include "loom/kernels/ops.h"
#include "testing/errors.h"

using namespace loom;
using loom::testing::error_of;
using loom::testing::GpuTest;
using loom::testing::to_device;
using loom::testing::to_host;

namespace {

constexpr double kUnitRoundoff = 0x1p-24;  // u of FP32

Tensor uniform_tensor(const Shape& shape, uint64_t stream, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::f32);
  CounterRng rng(20, stream);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * rng.uniform();
  return t;
}

struct LinearShape {
  Shape x;  // [..., I]
  int64_t out;
  bool bias;
};

std::string name_of(const LinearShape& s) {
  std::ostringstream o;
  o << "x" << s.x.str() << " out " << s.out << (s.bias ? " with bias" : " without bias");
  return o.str();
}

}  // namespace

using CudaLinear = GpuTest;
using CudaGelu = GpuTest;

// cuBLAS and OpenBLAS both compute each output as an FP32 sum of I products plus the bias, in
// different orders (blocking, split-K, FMA). Any such order is within gamma_{I+2} *
// (sum_k |x_k w_k| + |b|) of the exact value, gamma_n = n u / (1 - n u) (Higham, "Accuracy and
// Stability of Numerical Algorithms", 2nd ed., 3.1; +2 for the bias add and the beta scaling),
// so the two differ by at most twice that. cuda_ops.cu keeps cuBLAS's default math mode,
// which is FP32; TF32 (10-bit mantissa inputs) would break the bound at the small shapes
// (its errors partly cancel over long sums), and KeepsFp32PrecisionNotTf32 catches it outright.
TEST_F(CudaLinear, MatchesCpuWithinFp32SummationBound) {
  const LinearShape shapes[] = {
      {{1, 1}, 1, true},       {{3, 5}, 7, true},       {{17, 33}, 65, false}, {{64, 128}, 96, true},
      {{129, 257}, 255, true}, {{1000, 1}, 3, true},    {{2, 1024}, 1, false}, {{2, 3, 31}, 17, true},
      {{5}, 9, true},          {{300, 768}, 513, true},
  };
  uint64_t stream = 0;
  for (const LinearShape& s : shapes) {
    SCOPED_TRACE(name_of(s));
    const int64_t I = s.x[s.x.ndim() - 1], O = s.out, N = s.x.numel() / I;
    Tensor x = uniform_tensor(s.x, ++stream, -1, 1);
    Tensor w = uniform_tensor({O, I}, ++stream, -1, 1);
    Tensor b = s.bias ? uniform_tensor({O}, ++stream, -1, 1) : Tensor();
    Tensor y_cpu = Tensor::empty({N, O}, DType::f32);
    ops::linear_forward(x, w, b, y_cpu);

    // Named, so the inputs outlive the asynchronous kernels (to_host waits for them).
    Tensor x_dev = to_device(x), w_dev = to_device(w), b_dev = s.bias ? to_device(b) : Tensor();
    Tensor y_dev = Tensor::empty({N, O}, DType::f32, MemCategory::activations, cuda::allocator());
    ops::linear_forward(x_dev, w_dev, b_dev, y_dev);
    Tensor y_gpu = to_host(y_dev);

    const double gamma = (I + 2) * kUnitRoundoff / (1 - (I + 2) * kUnitRoundoff);
    double worst = 0;  // largest |difference| / bound
    int bad = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double magnitude = s.bias ? std::abs(double(b.data<float>()[o])) : 0.0;
        for (int64_t k = 0; k < I; ++k)
          magnitude += std::abs(double(x.data<float>()[n * I + k]) * double(w.data<float>()[o * I + k]));
        const double bound = 2 * gamma * magnitude;
        const double got = y_gpu.data<float>()[n * O + o], want = y_cpu.data<float>()[n * O + o];
        const double diff = std::abs(got - want);
        if (!(diff <= bound) && bad++ < 5)
          ADD_FAILURE() << "y[" << n << ", " << o << "]: gpu " << got << ", cpu " << want << ", |diff| " << diff
                        << " > bound " << bound;
        if (bound > 0) worst = std::max(worst, diff / bound);
      }
    EXPECT_EQ(bad, 0) << bad << " elements outside the bound; worst |diff|/bound " << worst;
  }
}

// Products of exactly representable FP32 values that TF32 would round: x = 1 + 2^-20 keeps
// its low mantissa bits only in FP32, so y must equal the exact product bit for bit.
TEST_F(CudaLinear, KeepsFp32PrecisionNotTf32) {
  const float x0 = 1.0f + 0x1p-20f;
  Tensor x = Tensor::from_vector<float>({x0, -x0}, {2, 1});
  Tensor w = Tensor::from_vector<float>({1.0f, 3.0f, 0.5f}, {3, 1});
  Tensor x_dev = to_device(x), w_dev = to_device(w);
  Tensor y_dev = Tensor::empty({2, 3}, DType::f32, MemCategory::activations, cuda::allocator());
  ops::linear_forward(x_dev, w_dev, Tensor(), y_dev);
  Tensor y = to_host(y_dev);
  const float want[] = {x0, 3 * x0, 0.5f * x0, -x0, -3 * x0, -0.5f * x0};
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(y.data<float>()[i], want[i]) << "element " << i << ": cuBLAS rounded its inputs (TF32?)";
}

// An empty batch (a micro-batch with no tokens, an expert no token was routed to) leaves y
// empty and raises no error, as on the CPU.
TEST_F(CudaLinear, EmptyBatch) {
  Tensor x = Tensor::empty({0, 8}, DType::f32, MemCategory::activations, cuda::allocator());
  Tensor w = to_device(uniform_tensor({4, 8}, 1, -1, 1));
  Tensor b = to_device(uniform_tensor({4}, 2, -1, 1));
  Tensor y = Tensor::empty({0, 4}, DType::f32, MemCategory::activations, cuda::allocator());
  EXPECT_EQ(error_of([&] { ops::linear_forward(x, w, b, y); }), "");
  EXPECT_EQ(error_of([&] { ops::linear_forward(x, w, Tensor(), y); }), "");
}

TEST_F(CudaLinear, RefusesMixedDevicesAndOtherDtypes) {
  Tensor x = uniform_tensor({2, 3}, 1, -1, 1), w = uniform_tensor({4, 3}, 2, -1, 1);
  Tensor y_dev = Tensor::empty({2, 4}, DType::f32, MemCategory::activations, cuda::allocator());
  std::string e = error_of([&] { ops::linear_forward(x, to_device(w), Tensor(), y_dev); });
  EXPECT_NE(e.find("[linear] mixing host and device tensors"), std::string::npos) << e;

  Tensor xd = Tensor::empty({2, 3}, DType::f64, MemCategory::other, cuda::allocator());
  Tensor wd = Tensor::empty({4, 3}, DType::f64, MemCategory::other, cuda::allocator());
  Tensor yd = Tensor::empty({2, 4}, DType::f64, MemCategory::other, cuda::allocator());
  e = error_of([&] { ops::linear_forward(xd, wd, Tensor(), yd); });
  EXPECT_NE(e.find("CUDA linear supports f32"), std::string::npos) << e;
}

// GELU, tanh form, both sides. The CPU's tanh is 1 - 2 / (exp(2z) + 1) with a 2-ulp exp, an
// absolute error under 8 ulp(1) = 2^-21 (cancellation near 0 makes it absolute, not
// relative); CUDA's tanhf is within 2 ulp. y = v (1 + t) / 2 then differs by at most
// |v| 2^-22 from t plus 4 ulp of |y| <= |v| from the remaining roundings: |v| 2^-21 in all.
// The test allows |v| 2^-20.
TEST_F(CudaGelu, MatchesCpuWithinTanhBound) {
  const float special[] = {0.0f, -0.0f, 1e-3f, -1e-3f, 1e-30f, 1.0f,   -1.0f,  3.0f,   -3.0f,
                           5.0f, -5.0f, 10.0f, -10.0f, 30.0f,  -30.0f, 100.0f, -100.0f};
  const int64_t sizes[] = {1, 7, 17, 255, 256, 257, 4097, (int64_t(1) << 20) + 3};
  for (int64_t n : sizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Tensor x = uniform_tensor({n}, uint64_t(n), -8, 8);
    for (int64_t i = 0; i < n && i < int64_t(std::size(special)); ++i) x.data<float>()[i] = special[i];
    Tensor y_cpu = Tensor::empty({n}, DType::f32);
    ops::gelu_forward(x, y_cpu);
    Tensor x_dev = to_device(x);
    Tensor y_dev = Tensor::empty({n}, DType::f32, MemCategory::activations, cuda::allocator());
    ops::gelu_forward(x_dev, y_dev);
    Tensor y_gpu = to_host(y_dev);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = x.data<float>()[i], got = y_gpu.data<float>()[i], want = y_cpu.data<float>()[i];
      const double bound = std::abs(v) * 0x1p-20;
      if (!(std::abs(got - want) <= bound) && bad++ < 5)
        ADD_FAILURE() << "gelu(" << v << "): gpu " << got << ", cpu " << want << ", bound " << bound;
    }
    EXPECT_EQ(bad, 0) << bad << " elements outside the bound";
  }
}

TEST_F(CudaGelu, EmptyTensor) {
  Tensor x = Tensor::empty({0}, DType::f32, MemCategory::activations, cuda::allocator());
  Tensor y = Tensor::empty({0}, DType::f32, MemCategory::activations, cuda::allocator());
  EXPECT_EQ(error_of([&] { ops::gelu_forward(x, y); }), "");
}

TEST_F(CudaGelu, RefusesOtherDtypes) {
  Tensor x = Tensor::empty({4}, DType::f64, MemCategory::other, cuda::allocator());
  Tensor y = Tensor::empty({4}, DType::f64, MemCategory::other, cuda::allocator());
  std::string e = error_of([&] { ops::gelu_forward(x, y); });
  EXPECT_NE(e.find("CUDA GELU needs f32 device tensors"), std::string::npos) << e;
}
