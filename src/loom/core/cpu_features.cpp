#include "loom/core/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)  // the Linux arm64 ABI's bit; older libc headers lack the name
#endif
#endif

#include <fstream>
#include <sstream>

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

std::string cpu_feature_names(const CpuFeatures& f) {
  const std::pair<bool, const char*> named[] = {{f.sse42, "sse4.2"},
                                                {f.avx2, "avx2"},
                                                {f.avx512, "avx512"},
                                                {f.avx512_vnni, "avx512-vnni"},
                                                {f.avx512_bf16, "avx512-bf16"},
                                                {f.avx_vnni, "avx-vnni"},
                                                {f.neon_dot, "neon-dot"}};
  std::string out;
  for (const auto& [present, name] : named)
    if (present) out += (out.empty() ? "" : " ") + std::string(name);
  return out.empty() ? "none" : out;
}

std::string cpu_model_from_cpuinfo(const std::string& cpuinfo) {
  std::istringstream in(cpuinfo);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

const std::string& cpu_model_name() {
  static const std::string name = [] {
    std::ifstream f("/proc/cpuinfo");
    std::stringstream text;
    text << f.rdbuf();
    return cpu_model_from_cpuinfo(text.str());
  }();
  return name;
}

}  // namespace loom
