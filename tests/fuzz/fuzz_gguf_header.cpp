// libFuzzer target: a GGUF file (header, typed metadata, tensor descriptions, data) opened as
// loom opens downloaded models, then every tensor dequantized. Damage must be refused with
// "[gguf] ..."; every tensor of an accepted file lies inside the file and dequantizes whole.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/io/gguf.h"
#include "loom/io/gguf_quants.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/loom-fuzz-gguf-" + std::to_string(::getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const auto file = loom::io::GgufFile::open(path);
    for (const auto& [key, v] : file.metadata()) (void)v.describe();
    std::vector<float> out;
    for (const auto& t : file.tensors()) {
      if (t.offset + t.nbytes > size) __builtin_trap();  // ranges lie inside the file
      if (!loom::io::ggml_type_supported(t.type) || t.numel() > (int64_t(1) << 20)) continue;
      out.resize(size_t(t.numel()));
      loom::io::dequantize(t.type, file.data(t), out.data(), t.numel());
    }
  } catch (const loom::Error& e) {
    if (std::strncmp(e.what(), "[gguf] ", 7) != 0) __builtin_trap();
  }
  return 0;
}
