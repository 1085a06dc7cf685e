// The token shard file: a fixed 128-byte little-endian header, then the tokens as u16 or
// u32. Written by `loom prepare` (ShardWriter), read by TokenDataset. The byte table is in
// docs/DATA.md; bump kShardVersion whenever the layout changes.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

namespace loom::data {

inline constexpr char kShardMagic[9] = "LOOMTOK1";
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 128;
inline constexpr uint32_t kNoEot = 0xFFFFFFFFu;

struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;  // 2: u16 tokens, 4: u32 tokens
  uint32_t vocab_size = 0;
  uint32_t eot_id = kNoEot;
  uint64_t n_tokens = 0;
  uint64_t checksum = 0;  // FNV-1a 64 of the payload bytes (TokenDataset checks it on open)
  std::string tokenizer;  // at most 31 bytes
  std::string split;      // "train" / "val"; at most 7 bytes
};

// FNV-1a 64 (Fowler-Noll-Vo); pass the previous value as `h` to continue a running hash.
inline constexpr uint64_t kFnvOffset = 14695981039346656037ull;
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnvOffset);

// u16 when every id fits, else u32.
uint32_t token_bytes_for_vocab(int64_t vocab_size);

void write_shard_header(const ShardHeader& h, unsigned char out[kShardHeaderBytes]);
// Parses and validates a header; `name` (the file) starts every error message.
ShardHeader parse_shard_header(const unsigned char* p, size_t file_bytes, const std::string& name);

// Streams tokens into `path` through `path.tmp`, then fills in the header and renames, so a
// crash never leaves a file that looks complete.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, ShardHeader header);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void append(std::span<const int32_t> ids);
  // Returns the final header (token count and checksum filled in).
  ShardHeader finish();

 private:
  std::string path_, tmp_;
  ShardHeader header_;
  std::FILE* f_ = nullptr;
  std::string buf_;
};

}  // namespace loom::data
