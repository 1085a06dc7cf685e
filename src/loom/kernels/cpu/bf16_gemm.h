// Matrix products of bf16-rounded f32 operands on AVX512-BF16 (vdpbf16ps), f32 accumulation:
// the engine behind ProductPrecision::bf16 where it beats rounding for SGEMM. Packing rounds
// each operand as round_to_bf16 does, so results equal the SGEMM path up to summation order
// (and bf16 denormals, which vdpbf16ps reads as zero). Not for f16, not for AMX.
#pragma once
#include <cstdint>
#include <type_traits>

#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/rounded_operands.h"

namespace loom::cpu {

// This CPU has AVX-512 (F, BW, VL, DQ) and AVX512-BF16 (CPUID.(EAX=7,ECX=1):EAX bit 5).
bool bf16_gemm_runs_here();

// Whether ProductPrecision::bf16 products go through bf16_gemm (else: rounded operands and
// SGEMM). Decided once per process: LOOM_BF16_GEMM=on|off forces it (on needs
// bf16_gemm_runs_here); otherwise it is on when the CPU has the instructions, the hot kernels
// run AVX-512 (not held below it by LOOM_ISA), and one core
// issues vdpbf16ps at >= 1.5x the multiply-adds per second of vfmadd231ps (a register-only
// loop of about a millisecond, the fastest of 5 tries each): 2x on Zen 4, 1x on the Xeons with
// AVX512-BF16 measured (docs/PERFORMANCE.md), where SGEMM is faster.
bool bf16_gemm_preferred();
// Products at precision p go through bf16_gemm (p is bf16 and bf16_gemm_preferred()).
inline bool on_bf16_gemm(ProductPrecision p) { return p == ProductPrecision::bf16 && bf16_gemm_preferred(); }
// The product path of ProductPrecision::bf16 in this process, for logs and benchmarks:
// "avx512-bf16 GEMM" or "bf16-rounded f32 x SGEMM".
const char* bf16_product_path();
// The measured ratio behind bf16_gemm_preferred (bf16 products per second / f32 FMA products
// per second on one core); 0 when the CPU lacks AVX512-BF16 or LOOM_BF16_GEMM decided.
double bf16_fma_rate_ratio();

// C[M,N] = bf16(op(A))[M,K] * bf16(op(B))[K,N] + beta * C, row-major f32 with leading
// dimensions, as cblas_sgemm with alpha = 1; beta is 0 or 1. Requires bf16_gemm_runs_here().
// Parallel over the OpenMP threads (loom::set_num_threads).
void bf16_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, float beta, float* C, int64_t ldc);

// C = op(A) op(B) + beta C on bf16_gemm when `engine` (f32 only; see on_bf16_gemm), else
// through BLAS (gemm.h) on the operands as given.
template <class T>
void product_gemm(bool engine, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                  int64_t ldb, T beta, T* C, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    if (engine) return bf16_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
  gemm(ta, tb, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
}

namespace bf16_gemm_detail {
// Implemented in bf16_gemm_avx512.cpp (compiled for AVX512-BF16); call only where it runs.
void gemm_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc);
// Seconds for `iters` rounds of 10 independent vdpbf16ps (or vfmadd231ps) zmm.
double dpbf16_loop_seconds(int64_t iters);
double fma_loop_seconds(int64_t iters);
}  // namespace bf16_gemm_detail

}  // namespace loom::cpu
