// Weight-only quantized linear layers for inference: int8 and int4 weights with f32 scales per
// group of inputs, and bf16 weights (no scales), y[M,O] = x[M,I] W[O,I]^T + b. On CPUs with
// VNNI or aarch64's dot-product extension the activations are quantized to int8 per row and
// block on the fly and the int8/int4 products are integer dot products; elsewhere, and always
// for bf16, W is widened to f32 in registers (few rows) or in blocks for BLAS (many rows), so
// bf16 rounds only the weights.
// Formats and their storage only; checkpoints and the model runner live in infer/.
#pragma once
#include <cstdint>
#include <string>

namespace loom::cpu {

enum class QuantFormat : uint8_t { int8, int4, bf16 };
const char* quant_format_name(QuantFormat f);  // "int8", "int4", "bf16"

// Storage, row-major per output row o (W is [O, I], y = x W^T + b):
//  int8: q[o*I + i] is int8_t stored in a uint8_t buffer (two's complement), in [-127, 127].
//  int4: two weights per byte, q[o*(I/2) + i/2], column i even in the low nibble; without
//        offsets each nibble is a signed value in [-8, 7] stored as (v & 0xF) and
//        w = scale * v; with offsets (asymmetric int4) each nibble is unsigned [0, 15] and
//        w = scale * nibble + offset, one f32 offset per group (GGUF's Q4_1 is this form).
//  bf16: q[2*(o*I + i)] holds the little-endian bits of bfloat16 weight (o, i); no scales.
//  scales: f32 [O, I/group]; offsets (asymmetric int4 only): f32 [O, I/group].
//  group: weights per scale along I; group == I means one scale per output row (per-channel),
//  and bf16's group is always I. I must be a multiple of group, and for int4 group must be
//  even (so I is even).
// No alignment is required of any pointer.
struct QuantView {
  QuantFormat format = QuantFormat::int8;
  int64_t rows = 0, cols = 0, group = 0;  // O, I, group
  const uint8_t* q = nullptr;
  const float* scales = nullptr;
  const float* offsets = nullptr;  // asymmetric int4, else null
};

// Bytes of one row of packed weights: I (int8), I/2 (int4), 2I (bf16).
int64_t quant_row_bytes(QuantFormat f, int64_t I);
// Bytes of the packed weights, scales and offsets of an O x I matrix. Throws as quantize_weights
// does for a group that does not fit.
int64_t quant_bytes(QuantFormat f, int64_t O, int64_t I, int64_t group, bool zero_point);

// Quantizes w[O, I], rounding to nearest (ties to even). Symmetric: scale = max|w| / 127 (int8)
// or / 7 (int4); a group of zeros gets scale 0. With a zero point (int4 only): the range is the
// group's [min, max] widened to contain 0 (so the zero is an integer z in [0, 15] and 0 is
// exact), scale = (max - min) / 15, z = round(-min / scale), stored as the offset -scale * z.
// Every element then satisfies |w - dequantized| <= scale / 2 (plus an f32 rounding of the
// offset). bf16: each weight rounded to nearest even (scales and offsets untouched;
// |w - dequantized| <= 2^-8 |w|). Writes q (layout above), scales and offsets (when
// zero_point). Throws loom::Error "[quant] ..." when group does not divide I, for int4 with an
// odd group, for int8 or bf16 with a zero point, and for bf16 with a group other than I.
void quantize_weights(const float* w, int64_t O, int64_t I, QuantFormat f, int64_t group, bool zero_point, uint8_t* q,
                      float* scales, float* offsets);
void dequantize_weights(const QuantView& w, float* out);  // out[O, I] f32

// y[M, O] = x[M, I] W^T + b (b may be null), any M. OpenMP threads over output rows. Scratch
// (the quantized activations; for many rows the repacked or dequantized W blocks) is
// thread_local and grows on demand, so calls allocate only when a shape is larger than any
// seen before on that thread; concurrent calls from different threads are safe. A row's
// result does not depend on M for few rows; from 16 rows (AVX512-VNNI: W repacked for a
// many-rows kernel) or above kQuantBlasMinRows (f32 paths: BLAS) it differs by f32 rounding.
void quant_linear(const float* x, const QuantView& w, const float* b, float* y, int64_t M);

// The path quant_linear takes on this CPU for this format, honouring LOOM_ISA=base|avx2|avx512
// and, for int8/int4, LOOM_QUANT_PATH=<one of these names>: "avx512-vnni", "avx-vnni" or
// "avx2-int" (int8/int4: integer dot products on activations quantized to int8 per row and
// block of at most 128 columns; vpdpbusd, or AVX2's vpmaddubsw), "neon-dot" (the same on aarch64
// with the dot-product extension: sdot, at any M), "avx512-bf16" (bf16 weights),
// "avx512-f32", "avx2-f32" or "base-f32" (W dequantized to f32 in registers; BLAS on
// dequantized blocks for M > kQuantBlasMinRows).
std::string quant_linear_path(QuantFormat f);

// Rows above which the f32 paths dequantize W in blocks and call BLAS.
inline constexpr int64_t kQuantBlasMinRows = 32;

}  // namespace loom::cpu
