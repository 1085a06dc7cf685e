// libFuzzer target: a safetensors file (the 8-byte header length, the JSON header, the data
// section) opened as loom opens checkpoints. Damage must be refused with "[safetensors] ...";
// the tensors of an accepted file must tile its data section exactly (located here from the
// input's own header length, not the reader's), and each must read back as the input's bytes.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

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
    if (size < 8) __builtin_trap();  // no header length, yet accepted
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | data[i];
    if (header > size - 8) __builtin_trap();
    const uint64_t data_bytes = size - 8 - header;
    const uint8_t* section = data + 8 + header;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (const auto& e : file.entries()) {
      if (e.end < e.begin || e.end > data_bytes) __builtin_trap();  // inside the data section
      const loom::Tensor t = file.get(e.name);
      if (uint64_t(t.nbytes()) != e.end - e.begin) __builtin_trap();
      if (t.nbytes() && std::memcmp(t.raw(), section + e.begin, t.nbytes()) != 0) __builtin_trap();
      ranges.push_back({e.begin, e.end});
    }
    std::sort(ranges.begin(), ranges.end());
    uint64_t at = 0;  // no holes, no overlaps, nothing after the last tensor
    for (const auto& [b, e] : ranges) {
      if (b != at) __builtin_trap();
      at = e;
    }
    if (at != data_bytes) __builtin_trap();
  } catch (const loom::Error& e) {
    if (std::strncmp(e.what(), "[safetensors] ", 14) != 0) __builtin_trap();
  }
  return 0;
}
