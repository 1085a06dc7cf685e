// Attributes that compile one function for an x86 instruction set inside a file built for every
// target (the function is then chosen at run time by a CPU feature probe). On other
// architectures they are empty: the function is compiled for the target's baseline (NEON on
// aarch64) and never chosen, since the probes there report no x86 features.
#pragma once

#if defined(__x86_64__)
#define LOOM_TARGET_AVX2 [[gnu::target("avx2,fma")]]
#define LOOM_TARGET_AVX512 [[gnu::target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,prefer-vector-width=512")]]
// One body compiled for AVX-512, AVX2 and the baseline, picked when the program loads (ifunc).
#define LOOM_TARGET_CLONES_X86 __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LOOM_TARGET_AVX2
#define LOOM_TARGET_AVX512
#define LOOM_TARGET_CLONES_X86
#endif
