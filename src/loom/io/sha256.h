// SHA-256 (OpenSSL's libcrypto) for content versions: a cascade's model versions and the
// hashes an edge checks its downloads against. CRC32C (checksum.h) stays the checkpoints'
// fast corruption check; this is for identity across machines.
#pragma once
#include <string>
#include <string_view>

namespace loom::io {

// Lowercase hex digest (64 characters).
std::string sha256_hex(std::string_view bytes);
// Of a whole file, read in large blocks. Throws "[io] <path>: ..." naming the OS error.
std::string sha256_file(const std::string& path);

}  // namespace loom::io
