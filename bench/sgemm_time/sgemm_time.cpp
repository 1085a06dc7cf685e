// LD_PRELOAD shim that times every single-precision GEMM a process makes through BLAS (the
// CBLAS entry point loom uses and the Fortran one PyTorch's generic BLAS path uses) and prints,
// at exit, the call count, FLOPs, seconds and rate per entry point on stderr:
//   SGEMM-TIME cblas_sgemm calls 588 flops 3.02e+12 seconds 14.70 GFLOP/s 205.4
// It is how docs/PERFORMANCE.md splits a training step into matrix products and the rest, for
// loom and for its PyTorch peer alike. Built by CMake as build/lib/libloom_sgemm_time.so:
//   LD_PRELOAD=build/lib/libloom_sgemm_time.so build/bin/loom bench train ...
// Not thread-safe across concurrent GEMM calls from different threads (neither caller makes
// any: BLAS parallelises inside one call).
#include <dlfcn.h>

#include <chrono>
#include <cstdio>

namespace {

struct Totals {
  const char* name;
  long calls = 0;
  double flops = 0, seconds = 0;
  ~Totals() {
    if (calls)
      std::fprintf(stderr, "SGEMM-TIME %s calls %ld flops %.3g seconds %.3f GFLOP/s %.1f\n", name, calls, flops,
                   seconds, flops / seconds * 1e-9);
  }
};
Totals cblas_totals{"cblas_sgemm"}, fortran_totals{"sgemm_"};

// The real symbol: the next definition after this library, or, for a library loaded later with
// RTLD_LOCAL (Python extension modules), the system BLAS.
void* real(const char* name) {
  if (void* f = dlsym(RTLD_NEXT, name)) return f;
  for (const char* lib : {"libcblas.so.3", "libblas.so.3", "libopenblas.so.0"})
    if (void* h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL))
      if (void* f = dlsym(h, name)) return f;
  std::fprintf(stderr, "SGEMM-TIME: cannot find %s in the loaded BLAS\n", name);
  return nullptr;
}

template <class F>
void timed(Totals& t, double flops, F&& call) {
  const auto t0 = std::chrono::steady_clock::now();
  call();
  t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t.flops += flops;
  ++t.calls;
}

}  // namespace

extern "C" {

// CBLAS enums are plain ints at the ABI level.
void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                 int ldb, float beta, float* C, int ldc) {
  using Fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
  static const Fn f = reinterpret_cast<Fn>(real("cblas_sgemm"));
  timed(cblas_totals, 2.0 * M * N * K, [&] { f(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
}

void sgemm_(const char* ta, const char* tb, const int* M, const int* N, const int* K, const float* alpha,
            const float* A, const int* lda, const float* B, const int* ldb, const float* beta, float* C,
            const int* ldc) {
  using Fn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                      const int*, const float*, const int*, const float*, float*, const int*);
  static const Fn f = reinterpret_cast<Fn>(real("sgemm_"));
  timed(fortran_totals, 2.0 * *M * *N * *K, [&] { f(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
}

}  // extern "C"
