// Matrix products at 16-bit precision where no faster 16-bit engine is used: each operand is
// rounded to the nearest bf16 or fp16 (ties to even) into f32 scratch and multiplied by SGEMM.
// A 16-bit value has at most 11 significant bits, so the product of two is exact in f32 and the
// result is that of 16-bit x 16-bit products with f32 accumulation (up to summation order), as
// a matrix engine computes it. For bf16 this is the path where vdpbf16ps issues at half the
// FMA rate or is absent (the Xeons in docs/PERFORMANCE.md, where oneDNN's bf16 matmul also ran
// at 0.6x SGEMM); where it issues as fast as the FMAs (Zen 4), linear layers and the LM head
// multiply bf16 products with bf16_gemm (bf16_gemm.h) instead, which rounds the same way while
// packing. fp16 rounding saturates to infinity beyond 65504, which is what loss scaling
// watches for.
#pragma once
#include <cstdint>

namespace loom::cpu {

// How a linear layer's matrix products round their operands.
enum class ProductPrecision : uint8_t { f32, bf16, f16 };
const char* product_precision_name(ProductPrecision p);  // "f32", "bf16", "f16"

// out[i] = in[i] rounded to the nearest bf16, ties to even; NaN stays NaN. out may equal in.
void round_to_bf16(const float* in, float* out, int64_t n);
// out[i] = in[i] rounded to the nearest fp16 (subnormals kept, beyond 65504: infinity).
void round_to_f16(const float* in, float* out, int64_t n);
// Storage in 16 bits (saved activations, wire buffers): out[i] = the bf16 (bf16 == true) or fp16
// bit pattern of in[i], rounded as round_to_bf16 / round_to_f16 round (bit-exact with
// f32_to_bf16 / f32_to_f16); and back, exactly.
void narrow_to_16(bool bf16, const float* in, uint16_t* out, int64_t n);
void widen_from_16(bool bf16, const uint16_t* in, float* out, int64_t n);

// round_to_bf16 or round_to_f16 (f32: a copy, or nothing in place).
void round_operand(ProductPrecision p, const float* in, float* out, int64_t n);

// p itself for f32; otherwise a copy of p[0, n) rounded as `prec` says, in the calling thread's
// scratch for operand `slot` (0-2: one per operand of a product), valid until the next call with
// that slot on this thread. The scratch is MemCategory::workspace of cpu_allocator(), kept at the
// largest size asked for.
const float* rounded_operand(ProductPrecision prec, int slot, const float* p, int64_t n);

}  // namespace loom::cpu
