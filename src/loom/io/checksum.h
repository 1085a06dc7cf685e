// CRC32C (Castagnoli polynomial, as in iSCSI, ext4 and leveldb) for checkpoint manifests:
// fast enough to checksum every shard on save and before every load. Not cryptographic.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::io {

// Continues a running checksum: crc32c_extend(crc32c(a), b) == crc32c(a + b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }
inline uint32_t crc32c(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }
// The table-driven path alone (what machines without SSE4.2 run); tests compare the two.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);

// Checksum of a whole file, read in large blocks. Throws "[io] <path>: ..." on I/O errors.
uint32_t crc32c_file(const std::string& path);

// "e3069283": the fixed-width lowercase form manifests store.
std::string crc32c_hex(uint32_t crc);
// Parses crc32c_hex's form; throws "[io] ..." naming the text when it is not 8 hex digits.
uint32_t crc32c_from_hex(std::string_view hex);

// "sse4.2" when the hardware instruction is used, "table" otherwise (for logs and benches).
const char* crc32c_impl();

}  // namespace loom::io
