// libFuzzer target: the 128-byte header of a token shard (data/shard_format.h), parsed as
// the loader parses it against the file's size. Damage must be refused with "[data] ...";
// an accepted header must describe a payload that fits the file.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "loom/core/error.h"
#include "loom/data/shard_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::data;
  if (size < kShardHeaderBytes) return 0;
  try {
    const ShardHeader h = parse_shard_header(data, size, "fuzz.bin");
    if (h.token_bytes != 2 && h.token_bytes != 4) __builtin_trap();
    if (h.n_tokens > (size - kShardHeaderBytes) / h.token_bytes) __builtin_trap();
  } catch (const loom::Error& e) {
    if (std::strncmp(e.what(), "[data] ", 7) != 0) __builtin_trap();
  }
  return 0;
}
