// SHA-256 against the FIPS 180-2 test vectors, and a file's digest equal to its bytes'.
#include <gtest/gtest.h>

#include <filesystem>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/io/sha256.h"

using namespace loom;

TEST(Sha256, MatchesTheStandardsVectors) {
  EXPECT_EQ(io::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(io::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(io::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, OfAFileEqualsOfItsBytesAndNamesAMissingFile) {
  const std::string path = ::testing::TempDir() + "/sha256_test.bin";
  std::string bytes(9 << 20, '\0');  // more than one read block
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 131 % 251);
  io::write_file_atomic(path, bytes);
  EXPECT_EQ(io::sha256_file(path), io::sha256_hex(bytes));
  std::filesystem::remove(path);
  try {
    io::sha256_file(path);
    FAIL() << "a missing file was hashed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}
