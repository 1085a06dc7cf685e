// Typed wrappers over CBLAS GEMM (row-major), f32 and f64. All matrix products in loom's
// CPU path go through here so the BLAS choice lives in one place.
#pragma once
#include <cblas.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <type_traits>

namespace loom::cpu {

// Wall time this process spends inside BLAS matrix products, when switched on (`loom bench
// train` splits its step with it). Off, a call costs one relaxed load more.
struct GemmClock {
  std::atomic<bool> on{false};
  std::atomic<int64_t> ns{0};
};
GemmClock& gemm_clock();

template <class F>
inline void timed_gemm(F&& call) {
  GemmClock& c = gemm_clock();
  if (!c.on.load(std::memory_order_relaxed)) return call();
  const auto t0 = std::chrono::steady_clock::now();
  call();
  c.ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
                 std::memory_order_relaxed);
}

template <class T>
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, T beta, T* C, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "BLAS GEMM is f32 or f64");
  if (M == 0 || N == 0) return;
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  timed_gemm([&] {
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, opa, opb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
    else
      cblas_dgemm(CblasRowMajor, opa, opb, int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
  });
}

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, row-major with leading dimensions.
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                 const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace loom::cpu
