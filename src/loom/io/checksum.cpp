// CRC32C two ways: the SSE4.2 crc32 instruction (8 bytes per instruction) when the CPU has
// it, else table-driven slicing-by-8 (Intel's "slicing-by-8", Kounavis & Berry 2005), with
// the tables built at compile time. Both compute the same reflected CRC with ~crc in and out.
#include "loom/io/checksum.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "loom/core/cpu_features.h"
#include "loom/core/error.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace loom::io {

namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPolyReflected : c >> 1;
    t[0][i] = c;
  }
  // t[k][i]: the CRC of byte i followed by k zero bytes.
  for (size_t k = 1; k < 8; ++k)
    for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  return t;
}

constexpr Tables kTables = make_tables();

uint32_t load_le32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // x86/ARM little-endian; loom does not target big-endian hosts
}

uint32_t extend_table(uint32_t crc, const unsigned char* p, size_t n) {
  while (n && (reinterpret_cast<uintptr_t>(p) & 7u)) {
    crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xffu];
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) {
    const uint32_t lo = load_le32(p) ^ crc, hi = load_le32(p + 4);
    crc = kTables[7][lo & 0xffu] ^ kTables[6][(lo >> 8) & 0xffu] ^ kTables[5][(lo >> 16) & 0xffu] ^
          kTables[4][lo >> 24] ^ kTables[3][hi & 0xffu] ^ kTables[2][(hi >> 8) & 0xffu] ^
          kTables[1][(hi >> 16) & 0xffu] ^ kTables[0][hi >> 24];
  }
  while (n--) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xffu];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t extend_sse42(uint32_t crc, const unsigned char* p, size_t n) {
  while (n && (reinterpret_cast<uintptr_t>(p) & 7u)) {
    crc = _mm_crc32_u8(crc, *p++);
    --n;
  }
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  crc = uint32_t(c);
  while (n--) crc = _mm_crc32_u8(crc, *p++);
  return crc;
}

bool have_sse42() { return cpu_features().sse42; }
#else
bool have_sse42() { return false; }
uint32_t extend_sse42(uint32_t crc, const unsigned char* p, size_t n) { return extend_table(crc, p, n); }
#endif

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  crc = have_sse42() ? extend_sse42(crc, p, n) : extend_table(crc, p, n);
  return ~crc;
}

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  return ~extend_table(~crc, static_cast<const unsigned char*>(data), n);
}

const char* crc32c_impl() { return have_sse42() ? "sse4.2" : "table"; }

uint32_t crc32c_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("io", path, ": cannot open for checksumming: ", std::strerror(errno));
  std::vector<unsigned char> buf(size_t(1) << 20);
  uint32_t crc = 0;
  for (;;) {
    const size_t got = std::fread(buf.data(), 1, buf.size(), f);
    crc = crc32c_extend(crc, buf.data(), got);
    if (got < buf.size()) break;
  }
  const bool bad = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  if (bad) fail("io", path, ": read error while checksumming: ", std::strerror(err));
  return crc;
}

std::string crc32c_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

uint32_t crc32c_from_hex(std::string_view hex) {
  LOOM_CHECK(hex.size() == 8, "io", "checksum '", hex, "' should be 8 hex digits");
  uint32_t v = 0;
  for (char ch : hex) {
    int d = -1;
    if (ch >= '0' && ch <= '9')
      d = ch - '0';
    else if (ch >= 'a' && ch <= 'f')
      d = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F')
      d = ch - 'A' + 10;
    LOOM_CHECK(d >= 0, "io", "checksum '", hex, "' should be 8 hex digits");
    v = (v << 4) | uint32_t(d);
  }
  return v;
}

}  // namespace loom::io
