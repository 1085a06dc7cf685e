// libFuzzer target: a safetensors file (the 8-byte header length, the JSON header, the data
// section) opened as loom opens checkpoints. Damage must be refused with "[safetensors] ...";
// every tensor of an accepted file must lie inside the file and be readable whole.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "loom/core/error.h"
#include "loom/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/loom-fuzz-safetensors-" + std::to_string(::getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const auto file = loom::io::SafetensorsFile::open(path);
    for (const auto& e : file.entries()) {
      if (e.end < e.begin || e.end > size) __builtin_trap();  // offsets are within the data section
      const loom::Tensor t = file.get(e.name);
      const unsigned char* p = static_cast<const unsigned char*>(t.raw());
      unsigned sum = 0;
      for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
      if (sum == 0xFFFFFFFFu) std::fputc(0, stderr);  // keep the reads
    }
  } catch (const loom::Error&) {
  }
  return 0;
}
