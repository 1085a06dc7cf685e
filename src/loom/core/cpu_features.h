// What this CPU can run, read once per process: the one probe behind every kernel choice made
// at run time (the f32 hot kernels' build, the quantized linears' path, the bf16 GEMM, the
// OpenBLAS core fix, CRC32C). On another architecture the x86 fields are false, and aarch64's
// dot-product extension is read from the kernel's hardware capabilities.
#pragma once
#include <string>

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
// The features that are present, by name, space-separated ("sse4.2 avx2 avx512 avx512-vnni
// avx512-bf16 avx-vnni neon-dot"); "none" when none is.
std::string cpu_feature_names(const CpuFeatures& f);

// This machine's CPU model ("model name" in /proc/cpuinfo), read once; "" where it is not given.
const std::string& cpu_model_name();
// The "model name" of the first processor in a /proc/cpuinfo text; "" when there is none.
std::string cpu_model_from_cpuinfo(const std::string& cpuinfo);

}  // namespace loom
