// What this CPU can run, read once per process: the one probe behind every kernel choice made
// at run time (the f32 hot kernels' build, the quantized linears' path, the bf16 GEMM, the
// OpenBLAS core fix, CRC32C). On another architecture the x86 fields are false, and aarch64's
// dot-product extension is read from the kernel's hardware capabilities.
#pragma once

namespace loom {

struct CpuFeatures {
  bool sse42 = false;
  bool avx2 = false;         // AVX2 with FMA (the "avx2" builds need both)
  bool avx512 = false;       // AVX-512 F, BW, VL and DQ (the "avx512" builds)
  bool avx512_vnni = false;  // and VNNI
  bool avx512_bf16 = false;  // and BF16
  bool avx_vnni = false;     // the VEX form of vpdpbusd, with AVX2
  bool neon_dot = false;     // aarch64 with the dot-product extension (sdot)
};

const CpuFeatures& cpu_features();

}  // namespace loom
