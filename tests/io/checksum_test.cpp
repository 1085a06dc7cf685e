// CRC32C against published vectors (RFC 3720 appendix B.4 and the common "123456789" check
// value), streaming equivalence, hardware/table agreement, and crc32c_file.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>

#include "loom/core/error.h"
#include "loom/io/checksum.h"
#include "loom/io/file.h"

using namespace loom;

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(io::crc32c(""), 0x00000000u);
  EXPECT_EQ(io::crc32c("a"), 0xC1D04330u);
  EXPECT_EQ(io::crc32c("123456789"), 0xE3069283u);
  // RFC 3720 B.4: 32 bytes of zeros, of 0xff, and an ascending sequence.
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = char(i);
  EXPECT_EQ(io::crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(io::crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(io::crc32c(inc), 0x46DD794Eu);
}

TEST(Crc32c, StreamingAndPortablePathAgree) {
  std::mt19937 g(7);
  std::string buf(10007, '\0');
  for (auto& c : buf) c = char(g());
  const uint32_t whole = io::crc32c(buf);
  // Every split point in the first 40 bytes exercises the unaligned head and tail loops.
  for (size_t cut = 0; cut < 40; ++cut) {
    uint32_t c = io::crc32c(buf.data(), cut);
    c = io::crc32c_extend(c, buf.data() + cut, buf.size() - cut);
    ASSERT_EQ(c, whole) << "cut at " << cut;
    ASSERT_EQ(io::crc32c_extend_portable(0, buf.data() + cut, buf.size() - cut),
              io::crc32c(buf.data() + cut, buf.size() - cut))
        << "offset " << cut;
  }
  EXPECT_EQ(io::crc32c_extend_portable(0, "123456789", 9), 0xE3069283u);
  buf[5000] ^= 1;  // a single flipped bit changes the checksum
  EXPECT_NE(io::crc32c(buf), whole);
}

TEST(Crc32c, HexRoundTrip) {
  EXPECT_EQ(io::crc32c_hex(0xE3069283u), "e3069283");
  EXPECT_EQ(io::crc32c_hex(0x1u), "00000001");
  EXPECT_EQ(io::crc32c_from_hex("E3069283"), 0xE3069283u);
  EXPECT_THROW(io::crc32c_from_hex("e30692"), Error);
  EXPECT_THROW(io::crc32c_from_hex("e306928g"), Error);
}

TEST(Crc32c, FileMatchesBuffer) {
  const std::string path = ::testing::TempDir() + "loom_crc_file.bin";
  std::string bytes(3 << 20, '\0');  // > one read block
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 2654435761u >> 13);
  io::write_file_atomic(path, bytes);
  EXPECT_EQ(io::crc32c_file(path), io::crc32c(bytes));
  std::remove(path.c_str());
  try {
    io::crc32c_file(path);
    FAIL() << "expected an error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}
