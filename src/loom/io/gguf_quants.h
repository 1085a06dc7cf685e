// What the bytes of a GGUF tensor mean: ggml's block formats turned into f32 (F32/F16/BF16/F64,
// the 32-element Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 and the 256-element K-quants Q2_K..Q6_K), and the
// few quantizers loom writes itself. Results are bit-identical to gguf-py's quants.py (see
// tests/golden/gguf_quants/). Reading the container is gguf.h; no I/O here.
#pragma once
#include <cstdint>
#include <string>

#include "loom/io/gguf.h"

namespace loom::io {

// Whether loom can dequantize type t.
bool ggml_type_supported(GgmlType t);

// Dequantizes n elements of type t at src (packed blocks, any alignment) into dst (f32).
// n must be a multiple of the type's block size; an unsupported type or such an n throws
// "[gguf] ..." naming the type.
void dequantize(GgmlType t, const void* src, float* dst, int64_t n);

// Quantizes n f32 values into type t's blocks, byte for byte as gguf-py's quantize() does.
// Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (n a multiple of 32 for the Q types).
std::string quantize(GgmlType t, const float* src, int64_t n);

}  // namespace loom::io
