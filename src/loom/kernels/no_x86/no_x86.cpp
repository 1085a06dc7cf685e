// Stand-ins for the x86 kernels (kernels/cpu/*_avx2.cpp, *_avx512.cpp, quant_vnni_*.cpp) in a
// build for another architecture (aarch64), where CMake leaves those files out. The CPU feature
// probes report no x86 features there, so the portable kernels are chosen and none of these is
// called; each throws if one is. A function declared for a new x86 file gets its stand-in here.
#include "loom/core/error.h"
#include "loom/kernels/cpu/bf16_gemm.h"
#include "loom/kernels/cpu/hot_table.h"
#include "loom/kernels/cpu/quant_linear_impl.h"

namespace loom::cpu {

namespace {
[[noreturn]] void no_x86(const char* kernel) {
  fail("isa", kernel, " is an x86 kernel and this loom was built for another architecture; the portable one runs here");
}
}  // namespace

const HotKernels* hot_kernels_avx2() { no_x86("hot_kernels_avx2"); }
const HotKernels* hot_kernels_avx512() { no_x86("hot_kernels_avx512"); }

namespace quant {
void quantize_acts_avx512(const float*, const QuantView&, const ActLayout&, int8_t*, float*, int32_t*, int64_t,
                          int64_t) {
  no_x86("quantize_acts_avx512");
}
void quantize_acts_avx2(const float*, const QuantView&, const ActLayout&, int8_t*, float*, int32_t*, int64_t, int64_t) {
  no_x86("quantize_acts_avx2");
}
void int_rows_avx512(const QuantActs&, const QuantView&, const float*, float*, int64_t, int64_t, int64_t) {
  no_x86("int_rows_avx512");
}
void int_rows_avx2(const QuantActs&, const QuantView&, const float*, float*, int64_t, int64_t, int64_t) {
  no_x86("int_rows_avx2");
}
void quantize_acts_avx2i(const float*, const QuantView&, const ActLayout&, int8_t*, float*, int32_t*, int64_t,
                         int64_t) {
  no_x86("quantize_acts_avx2i");
}
void int_rows_avx2i(const QuantActs&, const QuantView&, const float*, float*, int64_t, int64_t, int64_t) {
  no_x86("int_rows_avx2i");
}
void ymm_gemm_quantize_acts(const float*, const QuantView&, const ActLayout&, int8_t*, float*, float*, int64_t,
                            int64_t) {
  no_x86("ymm_gemm_quantize_acts");
}
int64_t ymm_gemm_items(const QuantView&) { no_x86("ymm_gemm_items"); }
void ymm_gemm_item_avx2i(const int8_t*, const float*, const float*, const QuantView&, const float*, float*, int64_t,
                         int64_t) {
  no_x86("ymm_gemm_item_avx2i");
}
void ymm_gemm_item_avx_vnni(const int8_t*, const float*, const float*, const QuantView&, const float*, float*, int64_t,
                            int64_t) {
  no_x86("ymm_gemm_item_avx_vnni");
}
bool gemm_fits(const QuantView&, const ActLayout&) { return false; }
void gemm_quantize_acts_avx512(const float*, const QuantView&, const ActLayout&, uint8_t*, float*, float*, int64_t,
                               int64_t) {
  no_x86("gemm_quantize_acts_avx512");
}
int64_t gemm_items(const QuantView&) { no_x86("gemm_items"); }
void gemm_panels_avx512(const uint8_t*, const float*, const float*, const QuantView&, const ActLayout&, const float*,
                        float*, int64_t, int64_t) {
  no_x86("gemm_panels_avx512");
}
void f32_rows_avx512(const float*, const QuantView&, const float*, float*, int64_t, int64_t, int64_t) {
  no_x86("f32_rows_avx512");
}
void f32_rows_avx2(const float*, const QuantView&, const float*, float*, int64_t, int64_t, int64_t) {
  no_x86("f32_rows_avx2");
}
void bf16_acts_avx512(const float*, int64_t, uint16_t*) { no_x86("bf16_acts_avx512"); }
void bf16_rows_avx512(const uint16_t*, const QuantView&, const float*, float*, int64_t, int64_t, int64_t) {
  no_x86("bf16_rows_avx512");
}
}  // namespace quant

namespace bf16_gemm_detail {
void gemm_avx512(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float, float*,
                 int64_t) {
  no_x86("bf16_gemm avx512");
}
double dpbf16_loop_seconds(int64_t) { no_x86("bf16_gemm's vdpbf16ps loop"); }
double fma_loop_seconds(int64_t) { no_x86("bf16_gemm's vfmadd231ps loop"); }
}  // namespace bf16_gemm_detail

}  // namespace loom::cpu
