// Row movement of Mixture-of-Experts layers: gathering the tokens' rows into per-expert groups,
// combining the experts' rows back per token with their router weights, and the gate
// gradients. Grouped row r holds choice choice_of[r] = token * k + j; row_of[token * k + j] is
// that choice's grouped row, or -1 when it was dropped. Parallel over rows or tokens, no
// atomics: every output row is written by one thread.
#pragma once
#include <cstdint>

namespace loom::cpu {

// out[r] = (scale ? scale[choice_of[r]] : 1) * x[choice_of[r] / k], r < n, rows of C.
template <class T>
void moe_gather_rows(const T* x, int64_t C, const int32_t* choice_of, int64_t k, const T* scale, int64_t n, T* out);

// y[t] (+)= sum over j < k with row_of[t k + j] >= 0 of (gates ? gates[t k + j] : 1) *
// rows[row_of[t k + j]], t < N. accumulate = false overwrites y.
template <class T>
void moe_combine(const T* rows, int64_t C, const int32_t* row_of, const T* gates, int64_t N, int64_t k, bool accumulate,
                 T* y);

// dgate[t k + j] = dot(dy[t], rows[row_of[t k + j]]), 0 for dropped choices.
template <class T>
void moe_gate_grads(const T* dy, const T* rows, int64_t C, const int32_t* row_of, int64_t N, int64_t k, T* dgate);

}  // namespace loom::cpu
