// Internals of quant_linear shared by its source files and tests: the kernel paths (so that a
// test can run every path this CPU has, not only the chosen one), the layout of the int8
// activations the integer-dot kernels read, and the per-path row kernels. Not a public API.
#pragma once
#include <cstdint>
#include <vector>

#include "loom/kernels/cpu/quant_linear.h"

namespace loom::cpu::quant {

// x86 paths, then aarch64's: neon_dot (integer dot products with sdot, FEAT_DotProd).
enum class Path : uint8_t { base_f32, avx2_f32, avx512_f32, avx2_int, avx_vnni, avx512_vnni, avx512_bf16, neon_dot };
const char* path_name(Path p);
bool path_runs_here(Path p);         // this CPU has the path's instructions
std::vector<Path> runnable_paths();  // every path for which path_runs_here
// The fastest runnable path, honouring LOOM_ISA, and for int8/int4 LOOM_QUANT_PATH (a path
// name; it must run here and multiply integer weights).
Path default_path(QuantFormat f);
inline bool is_integer_path(Path p) {
  return p == Path::avx2_int || p == Path::avx_vnni || p == Path::avx512_vnni || p == Path::neon_dot;
}
// AVX512-BF16 dot products: bf16 weights only, with x rounded to bf16 (up to kQuantBlasMinRows
// rows; above, W is widened for BLAS as on the f32 paths).
inline bool is_bf16_dot_path(Path p) { return p == Path::avx512_bf16; }

// A tile of OT weight rows is one contiguous run of bytes, but the kernels read it a few
// bytes from each row at a time, and with this much arithmetic per byte the loads alone do
// not run far enough ahead of the work to keep DRAM busy. So while working through bytes
// [from, to) of a tile's share, they prefetch the same share of the run that starts 4 KiB
// past the tile's end (the next tile, in memory order). Measured on 2 Xeon cores (gpt2-124m,
// the 49 matrices of a decode step, int4 g64): 5.9 -> 4.0 ms per step; one core streaming
// the head from DRAM: 6.1 -> 11.4 GB/s. 16 KiB, or prefetching into L2 only, was no better.
// always_inline: GCC deems a prefetch free of side effects and drops calls it did not inline.
[[gnu::always_inline]] inline void prefetch_next_tile(const uint8_t* tile, int64_t tile_bytes, int64_t from,
                                                      int64_t to) {
  const uint8_t* next = tile + tile_bytes + 4096;
  for (int64_t k = from & ~int64_t(63); k < to; k += 64) __builtin_prefetch(next + k, 0, 3);
}

// quant_linear on a given path.
void quant_linear_with(Path p, const float* x, const QuantView& w, const float* b, float* y, int64_t M);

void check_shape(QuantFormat f, int64_t O, int64_t I, int64_t group, bool zero_point);
void check_view(const QuantView& w);
void dequantize_row(const QuantView& w, int64_t o, float* out);  // out[I]

// The integer kernels read x quantized to int8 per row and block: blocks of `block` columns
// (a block never spans two weight groups), each with scale = max|x| / 127 and the sum of its
// int8 values (the kernels feed unsigned weights u = w + z to vpdpbusd and subtract z * sum,
// or add offset * sum for asymmetric int4).
// For int4 each vector of x holds a chunk's even columns and the next its odd ones, the order
// in which the kernels unpack low and high nibbles. Two layouts:
//  - stepped (blocks of 32, 64 or 128 columns that tile I into steps of whole vectors): per
//    step of `step` columns, the step's x bytes, then one vector of per-lane scales (lane k
//    holds its block's scale) and one of per-lane corrections (the first lane of each block
//    holds -z * sum for int8 and symmetric int4, or sum as f32 for asymmetric int4);
//  - generic (any shape): blocks of whole zero-padded chunks, with scales and sums in the
//    separate arrays of QuantActs.
struct ActLayout {
  int64_t chunk = 0;  // bytes per vector register (64 zmm, 32 ymm, 16 NEON)
  int64_t block = 0;  // columns per block
  bool stepped = false;
  int64_t step = 0;              // stepped: columns per step
  int64_t blocks_per_step = 0;   // stepped: 1, 2 or 4
  int64_t step_bytes = 0;        // stepped: x bytes, scale vector, correction vector
  int64_t blocks_per_group = 0;  // generic
  int64_t block_bytes = 0;       // generic: whole chunks of a full block
  int64_t group_bytes = 0;       // generic
  int64_t row_bytes = 0;
  int64_t row_blocks = 0;  // generic
};
// chunk: the vector bytes of the kernel; stepped_ok: whether it has stepped kernels.
ActLayout act_layout(const QuantView& w, int64_t chunk, bool stepped_ok = true);

struct QuantActs {
  const int8_t* q = nullptr;     // [M, row_bytes]
  const float* scale = nullptr;  // generic: [M, row_blocks]
  const int32_t* sum = nullptr;  // generic: [M, row_blocks]
  ActLayout lay;
};

// Quantizes rows [m0, m1) of x[M, I] into the layout (buffers sized for all M rows).
using QuantizeActsFn = void (*)(const float* x, const QuantView& w, const ActLayout& lay, int8_t* q, float* scale,
                                int32_t* sum, int64_t m0, int64_t m1);
// Outputs [o0, o1) of y[M, O] for all M rows (the OpenMP region stays with the caller: GCC
// outlines a parallel region's body into a function that would not inherit the target).
using IntRowsFn = void (*)(const QuantActs& a, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                           int64_t o1);
using F32RowsFn = void (*)(const float* x, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                           int64_t o1);

void quantize_acts_avx512(const float*, const QuantView&, const ActLayout&, int8_t*, float*, int32_t*, int64_t,
                          int64_t);
void quantize_acts_avx2(const float*, const QuantView&, const ActLayout&, int8_t*, float*, int32_t*, int64_t, int64_t);
void int_rows_avx512(const QuantActs&, const QuantView&, const float*, float*, int64_t, int64_t, int64_t);
void int_rows_avx2(const QuantActs&, const QuantView&, const float*, float*, int64_t, int64_t, int64_t);
// AVX2 without VNNI (quant_int_avx2.cpp): the same layout as AVX-VNNI's except that int8
// weights keep their sign (no -128 * sum correction).
void quantize_acts_avx2i(const float*, const QuantView&, const ActLayout&, int8_t*, float*, int32_t*, int64_t, int64_t);
void int_rows_avx2i(const QuantActs&, const QuantView&, const float*, float*, int64_t, int64_t, int64_t);
// aarch64 with the dot-product extension (quant_int_neon.cpp, sdot on 16-byte vectors): int8
// weights signed as on avx2-int; one kernel for any number of rows. kernels/no_arm/no_arm.cpp
// stands in for these elsewhere.
void quantize_acts_neon(const float*, const QuantView&, const ActLayout&, int8_t*, float*, int32_t*, int64_t, int64_t);
void int_rows_neon(const QuantActs&, const QuantView&, const float*, float*, int64_t, int64_t, int64_t);
// The many-rows kernel of AVX512-VNNI (quant_vnni_gemm.cpp): x as u8 (x + 128) [M, I] with
// scales and the int8 values' sums [M, I / block]; W packed per work item of 48 output rows. Used from kGemmMinRows
// rows (measured on one core for 2304 x 768: the two kernels cross between 8 and 12 rows, where repacking W costs about
// what the few-rows kernel loses; at 24 rows this one is 1.6-1.8x). It quantizes x exactly as the few-rows kernels do,
// so results differ only in f32 rounding.
inline constexpr int64_t kGemmMinRows = 16;
bool gemm_fits(const QuantView& w, const ActLayout& lay);
void gemm_quantize_acts_avx512(const float* x, const QuantView& w, const ActLayout& lay, uint8_t* xa, float* sx,
                               float* sums, int64_t m0, int64_t m1);
int64_t gemm_items(const QuantView& w);
void gemm_panels_avx512(const uint8_t* xa, const float* sx, const float* sums, const QuantView& w, const ActLayout& lay,
                        const float* b, float* y, int64_t M, int64_t item);

// The many-rows kernel of the AVX2 integer paths (quant_gemm_ymm.h): x quantized [M, I] as the
// few-rows kernels quantize it, with each 32-column sub-block's activation scale and scale x
// sum [M, I / 32]; W packed per work item of 32 outputs. Used from kYmmGemmMinRows rows where
// gemm_fits.
inline constexpr int64_t kYmmGemmMinRows = 16;
void ymm_gemm_quantize_acts(const float* x, const QuantView& w, const ActLayout& lay, int8_t* xq, float* sx,
                            float* sxsum, int64_t m0, int64_t m1);
int64_t ymm_gemm_items(const QuantView& w);
void ymm_gemm_item_avx2i(const int8_t* xq, const float* sx, const float* sxsum, const QuantView& w, const float* b,
                         float* y, int64_t M, int64_t item);
void ymm_gemm_item_avx_vnni(const int8_t* xq, const float* sx, const float* sxsum, const QuantView& w, const float* b,
                            float* y, int64_t M, int64_t item);

void f32_rows_avx512(const float*, const QuantView&, const float*, float*, int64_t, int64_t, int64_t);
void f32_rows_avx2(const float*, const QuantView&, const float*, float*, int64_t, int64_t, int64_t);
void f32_rows_base(const float*, const QuantView&, const float*, float*, int64_t, int64_t, int64_t);
// AVX512-BF16 (quant_bf16_avx512.cpp): x[n] rounded to bf16, and outputs [o0, o1) of bf16
// weights for all M rows of the rounded x.
void bf16_acts_avx512(const float* x, int64_t n, uint16_t* out);
void bf16_rows_avx512(const uint16_t* xb, const QuantView& w, const float* b, float* y, int64_t M, int64_t o0,
                      int64_t o1);
// Any group, one dequantized row at a time (the f32 kernels' fallback for odd groups).
void f32_rows_any_group(const float*, const QuantView&, const float*, float*, int64_t, int64_t, int64_t);

}  // namespace loom::cpu::quant
