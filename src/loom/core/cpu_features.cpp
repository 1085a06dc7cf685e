#include "loom/core/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)  // the Linux arm64 ABI's bit; older libc headers lack the name
#endif
#endif

namespace loom {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
#if defined(__x86_64__)
    __builtin_cpu_init();
    c.sse42 = __builtin_cpu_supports("sse4.2");
    c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    c.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    c.avx512_vnni = c.avx512 && __builtin_cpu_supports("avx512vnni");
    // AVX-VNNI and AVX512-BF16 are CPUID.(EAX=7,ECX=1):EAX bits 4 and 5; read directly, as not
    // every compiler's __builtin_cpu_supports knows their names (clang 14 does not).
    unsigned a = 0, b = 0, cx = 0, d = 0;
    const bool leaf = __get_cpuid_count(7, 1, &a, &b, &cx, &d);
    c.avx_vnni = c.avx2 && leaf && (a & (1u << 4));
    c.avx512_bf16 = c.avx512 && leaf && (a & (1u << 5));
#elif defined(__aarch64__)
    c.neon_dot = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    return c;
  }();
  return f;
}

}  // namespace loom
