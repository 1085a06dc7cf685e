// hot_impl.h compiled for the avx512 instruction set (flags set in src/CMakeLists.txt).
#define LOOM_ISA avx512
#include "loom/kernels/cpu/hot_impl.h"
#include "loom/kernels/cpu/hot_table.h"

namespace loom::cpu {
LOOM_HOT_TABLE(avx512)
}  // namespace loom::cpu
