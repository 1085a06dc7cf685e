// A linear layer for the few-row case of decoding (y[M,O] = x[M,I] W[O,I]^T + b), which is
// bound by streaming W from memory: W is read once per four rows, with no packing. BLAS GEMM
// packs W first and, at M = 1, moves two to three times the bytes. f32 only; chosen at run
// time for AVX-512, AVX2 or the baseline. Each output's summation order is fixed, so a row's
// result does not depend on M.
#pragma once
#include <cstdint>

namespace loom::infer {

// Rows at or below this go through decode_linear; more are left to BLAS (the crossover
// measured for gpt2-124m on 2 AVX-512 cores lies between 12 and 16 rows).
inline constexpr int64_t kDecodeLinearMaxRows = 12;

void decode_linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t I,
                   int64_t O);

}  // namespace loom::infer
