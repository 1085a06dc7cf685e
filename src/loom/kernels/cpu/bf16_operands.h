// Matrix products at bf16 precision where no faster bf16 engine is used: each operand is rounded
// to the nearest bf16 (ties to even) into f32 scratch and multiplied by SGEMM. A bf16 value has 8
// significant bits, so the product of two is exact in f32 and the result is that of bf16 x bf16
// products with f32 accumulation (up to summation order), as a matrix engine computes it. On
// the CPUs measured (docs/PERFORMANCE.md) this is also the fastest way there: AVX512-BF16's
// vdpbf16ps issues at half the FMA rate, and oneDNN's bf16 matmul ran at 0.6x SGEMM.
#pragma once
#include <cstdint>

namespace loom::cpu {

// How a linear layer's matrix products round their operands.
enum class ProductPrecision : uint8_t { f32, bf16 };
const char* product_precision_name(ProductPrecision p);  // "f32", "bf16"

// out[i] = in[i] rounded to the nearest bf16, ties to even; NaN stays NaN. out may equal in.
void round_to_bf16(const float* in, float* out, int64_t n);

// A rounded copy of p[0, n) in the calling thread's scratch for operand `slot` (0-2: one per
// operand of a product), valid until the next call with that slot on this thread. The scratch
// is MemCategory::workspace of cpu_allocator(), kept at the largest size asked for.
const float* bf16_rounded(int slot, const float* p, int64_t n);

}  // namespace loom::cpu
