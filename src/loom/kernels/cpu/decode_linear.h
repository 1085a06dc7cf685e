// A linear layer for the few-row case of decoding (y[M,O] = x[M,I] W[O,I]^T + b): W is
// streamed from memory once for all M rows, with no packing, in register tiles of rows x
// outputs. BLAS GEMM packs W first and, at M = 1, moves two to three times the bytes. f32
// only; chosen at run time for AVX-512, AVX2 or the baseline. Each output's summation order
// is fixed, so a row's result does not depend on M.
#pragma once
#include <cstdint>
#include <string>

namespace loom::cpu {

// Rows at or below this go through decode_linear; more are left to BLAS. Measured for
// gpt2-124m's layers on 2 AVX-512 cores (all 49 matrices of one step, quiet machine): 16 rows
// 29 ms against BLAS's 46 ms; with the machine loaded, 32 rows 103 against 132 and 64 rows
// 196 against 206 (BLAS packs all of W on every call, which costs as much as the products
// until M is in the hundreds).
inline constexpr int64_t kDecodeLinearMaxRows = 64;

void decode_linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I, int64_t O);
// The instruction-set build decode_linear runs: the hot kernels' (CPU features, or LOOM_ISA).
std::string decode_linear_isa();

// decode_linear on one of the instruction-set builds cpu::isas_here() names (for tests and
// comparisons; throws for one this CPU lacks).
void decode_linear_on(const std::string& isa, const float* x, const float* w, const float* b, float* y, int64_t M,
                      int64_t I, int64_t O);

}  // namespace loom::cpu
