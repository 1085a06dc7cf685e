// hot_impl.h compiled for the avx2 instruction set (flags set in src/CMakeLists.txt).
#define LOOM_ISA avx2
#include "loom/kernels/cpu/hot_impl.h"
#include "loom/kernels/cpu/hot_table.h"

namespace loom::cpu {
LOOM_HOT_TABLE(avx2)
}  // namespace loom::cpu
