// The token shard file: a fixed 128-byte little-endian header, the tokens as u16 or u32, then
// (version 2, when the header's flags say so) a loss mask of one byte per token. Written by
// `loom prepare` (ShardWriter), read by TokenDataset. The byte table is in docs/DATA.md; bump
// kShardVersion whenever the layout changes. Version 1 files (no flags, no mask) still load.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

namespace loom::data {

inline constexpr char kShardMagic[9] = "LOOMTOK1";
inline constexpr uint32_t kShardVersion = 2;
inline constexpr uint32_t kShardOldestVersion = 1;
inline constexpr size_t kShardHeaderBytes = 128;
inline constexpr uint32_t kNoEot = 0xFFFFFFFFu;

// Header flags (version 2).
inline constexpr uint32_t kShardHasMask = 1u;  // a mask byte per token follows the tokens

// The bits of a mask byte. A token is a conversation's first when `loom prepare --chat` wrote
// it so; it is "trained" when the loss counts it as a target (an assistant reply's tokens and
// its end-of-turn token). Shards without a mask train every token and hold one document.
inline constexpr uint8_t kMaskTrained = 1u;
inline constexpr uint8_t kMaskConversationStart = 2u;
inline constexpr uint8_t kMaskKnownBits = kMaskTrained | kMaskConversationStart;

struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;  // 2: u16 tokens, 4: u32 tokens
  uint32_t vocab_size = 0;
  uint32_t eot_id = kNoEot;
  uint32_t flags = 0;  // kShardHasMask; always 0 in version 1
  uint64_t n_tokens = 0;
  // FNV-1a 64 of the payload bytes, the tokens then the mask (TokenDataset checks it on open)
  uint64_t checksum = 0;
  std::string tokenizer;  // at most 31 bytes
  std::string split;      // "train" / "val"; at most 7 bytes

  bool has_mask() const { return (flags & kShardHasMask) != 0; }
  // Payload bytes: the tokens, and the mask where there is one.
  uint64_t payload_bytes() const { return n_tokens * (token_bytes + (has_mask() ? 1 : 0)); }
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
// crash never leaves a file that looks complete. With kShardHasMask in the header's flags,
// every append brings one mask byte per id; they wait in `path.mask.tmp` until finish()
// appends them after the tokens.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, ShardHeader header);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void append(std::span<const int32_t> ids);
  void append(std::span<const int32_t> ids, std::span<const uint8_t> mask);
  // Returns the final header (token count and checksum filled in).
  ShardHeader finish();

 private:
  void write_tokens(std::span<const int32_t> ids);

  std::string path_, tmp_, mask_tmp_;
  ShardHeader header_;
  std::FILE* f_ = nullptr;
  std::FILE* mask_f_ = nullptr;
  std::string buf_;
};

}  // namespace loom::data
