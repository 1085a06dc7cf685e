// Stand-ins for the aarch64 kernels (kernels/cpu/*_neon.cpp) in a build for another
// architecture (x86-64), where CMake leaves those files out. The CPU feature probe reports no
// dot-product extension there, so path neon-dot never runs and none of these is called; each
// throws if one is. A function declared for a new *_neon.cpp file gets its stand-in here.
#include "loom/core/error.h"
#include "loom/kernels/cpu/quant_linear_impl.h"

namespace loom::cpu::quant {

namespace {
[[noreturn]] void no_arm(const char* kernel) {
  fail("isa", kernel,
       " is an aarch64 kernel and this loom was built for another architecture; the ones for this "
       "CPU run here");
}
}  // namespace

void quantize_acts_neon(const float*, const QuantView&, const ActLayout&, int8_t*, float*, int32_t*, int64_t, int64_t) {
  no_arm("quantize_acts_neon");
}
void int_rows_neon(const QuantActs&, const QuantView&, const float*, float*, int64_t, int64_t, int64_t) {
  no_arm("int_rows_neon");
}

}  // namespace loom::cpu::quant
