// CUDA implementations of the ops that have a device kernel, and the device allocator.
// Compiled only when CMake finds a CUDA toolkit (LOOM_WITH_CUDA=ON); no_cuda/no_cuda.cpp
// stands in otherwise. Linear runs on cuBLAS; GELU is a plain elementwise kernel.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "loom/kernels/cuda/cuda_ops.h"

namespace loom::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda", what, ": ", cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuda", what, ": cuBLAS status ", int(s));
}

// One cuBLAS handle for the process's device work, created on first use.
cublasHandle_t blas() {
  static cublasHandle_t h = [] {
    cublasHandle_t x;
    check(cublasCreate(&x), "cublasCreate");
    return x;
  }();
  return h;
}

class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemCategory cat) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    record_alloc(bytes, cat);
    return p;
  }
  void deallocate(void* p, size_t bytes, MemCategory cat) override {
    if (!p) return;
    cudaFree(p);
    record_free(bytes, cat);
  }
  const char* device_name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }
};

__global__ void broadcast_rows(const float* b, float* y, int64_t N, int64_t O) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N * O) y[i] = b[i % O];
}

// GELU, tanh approximation (as the CPU kernel).
__global__ void gelu_kernel(const float* x, float* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  }
}

unsigned blocks_for(int64_t n) { return unsigned((n + 255) / 256); }

}  // namespace

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string describe() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return "cuda: built with CUDA, no device found";
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  return str_cat("cuda: ", n, " device(s) (", p.name, ", sm_", p.major, p.minor, ")");
}

Allocator& allocator() {
  static CudaAllocator a;
  return a;
}

void copy(const Tensor& dst, const Tensor& src) {
  LOOM_CHECK(dst.nbytes() == src.nbytes(), "cuda", "copy of ", src.describe(), " into ", dst.describe());
  const bool dd = dst.device() == Device::cuda, sd = src.device() == Device::cuda;
  const cudaMemcpyKind kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                 : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  check(cudaMemcpy(dst.device_raw(), src.device_raw(), src.nbytes(), kind), "cudaMemcpy");
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  LOOM_CHECK(x.dtype() == DType::f32, "linear", "CUDA linear supports f32, got ", x.describe());
  LOOM_CHECK(x.device() == Device::cuda && w.device() == Device::cuda && y.device() == Device::cuda &&
                 (!b.defined() || b.device() == Device::cuda),
             "linear", "mixing host and device tensors: ", x.describe(), ", ", w.describe());
  const int64_t O = w.size(0), I = w.size(1), N = x.numel() / I;
  // Nothing to write (an empty micro-batch, an expert without tokens); a launch of zero
  // blocks would fail with "invalid configuration argument".
  if (N * O == 0) return;
  float beta = 0.0f;
  if (b.defined()) {
    broadcast_rows<<<blocks_for(N * O), 256>>>(b.device_data<float>(), y.device_data<float>(), N, O);
    check(cudaGetLastError(), "broadcast_rows");
    beta = 1.0f;
  }
  // Row-major y[N,O] = x[N,I] w[O,I]^T is column-major y^T[O,N] = w^T[O,I] x^T[I,N].
  const float alpha = 1.0f;
  check(cublasSgemm(blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(O), int(N), int(I), &alpha, w.device_data<float>(), int(I),
                    x.device_data<float>(), int(I), &beta, y.device_data<float>(), int(O)),
        "cublasSgemm");
}

void gelu_forward(const Tensor& x, const Tensor& y) {
  LOOM_CHECK(x.dtype() == DType::f32 && x.device() == Device::cuda && y.device() == Device::cuda, "gelu",
             "CUDA GELU needs f32 device tensors, got ", x.describe());
  if (x.numel() == 0) return;  // zero blocks is an invalid launch
  gelu_kernel<<<blocks_for(x.numel()), 256>>>(x.device_data<float>(), y.device_data<float>(), x.numel());
  check(cudaGetLastError(), "gelu_kernel");
}

}  // namespace loom::cuda
