// Header (de)serialisation with field-by-field validation, and the streaming shard writer
// (tokens to the file, mask bytes to a side file appended at finish).
#include "loom/data/shard_format.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "loom/core/error.h"

namespace loom::data {

static_assert(std::endian::native == std::endian::little, "shards are little-endian");

namespace {
template <class T>
void put(unsigned char* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof(T));
}
template <class T>
T get(const unsigned char* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}
std::string fixed_string(const unsigned char* p, size_t n) {
  size_t len = 0;
  while (len < n && p[len]) ++len;
  return std::string(reinterpret_cast<const char*>(p), len);
}
std::string printable(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (p[i] >= 0x20 && p[i] < 0x7F) ? char(p[i]) : '?';
  return s;
}
}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint32_t token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

void write_shard_header(const ShardHeader& h, unsigned char out[kShardHeaderBytes]) {
  LOOM_CHECK(h.tokenizer.size() < 32 && h.split.size() < 8, "data",
             "tokenizer name (max 31 bytes) or split name (max 7 bytes) too long");
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out, kShardMagic, 8);
  put<uint32_t>(out, 8, h.version);
  put<uint32_t>(out, 12, uint32_t(kShardHeaderBytes));
  put<uint32_t>(out, 16, h.token_bytes);
  put<uint32_t>(out, 20, h.vocab_size);
  put<uint32_t>(out, 24, h.eot_id);
  put<uint32_t>(out, 28, h.flags);
  put<uint64_t>(out, 32, h.n_tokens);
  put<uint64_t>(out, 40, h.checksum);
  std::memcpy(out + 48, h.tokenizer.data(), h.tokenizer.size());
  std::memcpy(out + 80, h.split.data(), h.split.size());
  put<uint64_t>(out, 120, fnv1a64(out, 120));
}

ShardHeader parse_shard_header(const unsigned char* p, size_t file_bytes, const std::string& name) {
  const char* fix = "re-run loom prepare to rebuild it";
  LOOM_CHECK(file_bytes >= kShardHeaderBytes, "data", name, " is ", file_bytes, " bytes, too short for the ",
             kShardHeaderBytes, "-byte token shard header; ", fix);
  LOOM_CHECK(std::memcmp(p, kShardMagic, 8) == 0, "data", name, " is not a loom token shard (magic '", printable(p, 8),
             "', expected '", kShardMagic, "'); point the loader at loom prepare's output");
  ShardHeader h;
  h.version = get<uint32_t>(p, 8);
  LOOM_CHECK(h.version >= kShardOldestVersion && h.version <= kShardVersion, "data", name, " has shard format version ",
             h.version, " but this loom reads versions ", kShardOldestVersion, " to ", kShardVersion, "; ", fix,
             " with this loom");
  LOOM_CHECK(get<uint32_t>(p, 12) == kShardHeaderBytes && get<uint64_t>(p, 120) == fnv1a64(p, 120), "data", name,
             " has a corrupt header (header checksum mismatch); ", fix);
  h.token_bytes = get<uint32_t>(p, 16);
  h.vocab_size = get<uint32_t>(p, 20);
  h.eot_id = get<uint32_t>(p, 24);
  h.flags = h.version >= 2 ? get<uint32_t>(p, 28) : 0;  // reserved (0) in version 1
  h.n_tokens = get<uint64_t>(p, 32);
  h.checksum = get<uint64_t>(p, 40);
  h.tokenizer = fixed_string(p + 48, 32);
  h.split = fixed_string(p + 80, 8);
  LOOM_CHECK(h.token_bytes == 2 || h.token_bytes == 4, "data", name, " stores ", h.token_bytes,
             "-byte tokens; only 2 (u16) and 4 (u32) exist; ", fix);
  LOOM_CHECK(h.vocab_size > 0 && (h.token_bytes == 4 || h.vocab_size <= 65536), "data", name, " has vocab_size ",
             h.vocab_size, ", which does not fit its ", h.token_bytes, "-byte tokens; ", fix);
  LOOM_CHECK((h.flags & ~kShardHasMask) == 0, "data", name, " has header flags ", h.flags,
             ", of which this loom knows only 1 (a loss mask); ", fix, " with this loom");
  const uint64_t payload = file_bytes - kShardHeaderBytes;
  const uint64_t per_token = h.token_bytes + (h.has_mask() ? 1 : 0);
  const char* what = h.has_mask() ? " tokens and their mask (" : " tokens (";
  LOOM_CHECK(h.n_tokens <= payload / per_token, "data", name, " is truncated: its header promises ", h.n_tokens, what,
             h.n_tokens * per_token, " bytes) but only ", payload, " payload bytes are there; ", fix);
  LOOM_CHECK(payload == h.payload_bytes(), "data", name, " has ", payload - h.payload_bytes(),
             " stray bytes after its ", h.n_tokens, what, h.payload_bytes(), " bytes); ", fix);
  return h;
}

ShardWriter::ShardWriter(const std::string& path, ShardHeader header)
    : path_(path), tmp_(path + ".tmp"), mask_tmp_(path + ".mask.tmp"), header_(std::move(header)) {
  LOOM_CHECK(header_.version >= 2 || header_.flags == 0, "prepare", path_,
             ": a version-1 shard has no header flags (no mask)");
  header_.n_tokens = 0;
  header_.checksum = kFnvOffset;
  f_ = std::fopen(tmp_.c_str(), "wb");
  LOOM_CHECK(f_, "prepare", "cannot create ", tmp_, ": ", std::strerror(errno));
  unsigned char blank[kShardHeaderBytes] = {};
  LOOM_CHECK(std::fwrite(blank, 1, sizeof blank, f_) == sizeof blank, "prepare", "write to ", tmp_,
             " failed: ", std::strerror(errno));
  if (header_.has_mask()) {
    mask_f_ = std::fopen(mask_tmp_.c_str(), "w+b");
    LOOM_CHECK(mask_f_, "prepare", "cannot create ", mask_tmp_, ": ", std::strerror(errno));
  }
}

ShardWriter::~ShardWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
  if (mask_f_) {
    std::fclose(mask_f_);
    std::remove(mask_tmp_.c_str());
  }
}

void ShardWriter::write_tokens(std::span<const int32_t> ids) {
  const uint32_t tb = header_.token_bytes;
  buf_.resize(ids.size() * tb);
  auto* out = reinterpret_cast<unsigned char*>(buf_.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    LOOM_CHECK(id >= 0 && uint32_t(id) < header_.vocab_size, "prepare", "token id ", id, " outside the vocabulary of ",
               header_.vocab_size);
    if (tb == 2) {
      put<uint16_t>(out, 2 * i, uint16_t(id));
    } else {
      put<uint32_t>(out, 4 * i, uint32_t(id));
    }
  }
  header_.checksum = fnv1a64(out, buf_.size(), header_.checksum);
  header_.n_tokens += ids.size();
  LOOM_CHECK(std::fwrite(out, 1, buf_.size(), f_) == buf_.size(), "prepare", "write to ", tmp_,
             " failed (disk full?): ", std::strerror(errno));
}

void ShardWriter::append(std::span<const int32_t> ids) {
  LOOM_CHECK(!header_.has_mask(), "prepare", path_, " has a loss mask: append its mask bytes with the tokens");
  write_tokens(ids);
}

void ShardWriter::append(std::span<const int32_t> ids, std::span<const uint8_t> mask) {
  LOOM_CHECK(header_.has_mask(), "prepare", path_, " has no loss mask (header flags); append tokens alone");
  LOOM_CHECK(mask.size() == ids.size(), "prepare", path_, ": ", ids.size(), " tokens but ", mask.size(), " mask bytes");
  for (size_t i = 0; i < mask.size(); ++i)
    LOOM_CHECK((mask[i] & ~kMaskKnownBits) == 0, "prepare", path_, ": mask byte ", int(mask[i]), " at token ",
               header_.n_tokens + i, " has bits other than trained (1) and conversation start (2)");
  write_tokens(ids);
  LOOM_CHECK(std::fwrite(mask.data(), 1, mask.size(), mask_f_) == mask.size(), "prepare", "write to ", mask_tmp_,
             " failed (disk full?): ", std::strerror(errno));
}

ShardHeader ShardWriter::finish() {
  bool ok = true;
  if (mask_f_) {  // the mask follows the tokens, and the checksum runs on over it
    ok = std::fflush(mask_f_) == 0 && std::fseek(mask_f_, 0, SEEK_SET) == 0;
    std::vector<unsigned char> chunk(size_t(1) << 20);
    size_t got = 0;
    while (ok && (got = std::fread(chunk.data(), 1, chunk.size(), mask_f_)) > 0) {
      header_.checksum = fnv1a64(chunk.data(), got, header_.checksum);
      ok = std::fwrite(chunk.data(), 1, got, f_) == got;
    }
    ok = ok && !std::ferror(mask_f_);
    std::fclose(mask_f_);
    mask_f_ = nullptr;
    std::remove(mask_tmp_.c_str());
  }
  unsigned char head[kShardHeaderBytes];
  write_shard_header(header_, head);
  ok = ok && std::fseek(f_, 0, SEEK_SET) == 0 && std::fwrite(head, 1, sizeof head, f_) == sizeof head &&
       std::fflush(f_) == 0;
  const int closed = std::fclose(f_);
  f_ = nullptr;
  if (!ok || closed != 0) {
    std::remove(tmp_.c_str());
    fail("prepare", "finishing ", tmp_, " failed: ", std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  LOOM_CHECK(!ec, "prepare", "cannot rename ", tmp_, " to ", path_, ": ", ec.message());
  return header_;
}

}  // namespace loom::data
