// Shared helpers for the data tests: the repo's data folder, one GPT-2 tokenizer loaded once
// per test binary, scratch folders, small file writers, and a token-shard payload editor.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "loom/data/gpt2_tokenizer.h"
#include "loom/data/shard_format.h"

namespace loom::data::testing {

inline std::string repo_data_dir() { return std::string(LOOM_SOURCE_DIR) + "/data"; }

inline const Gpt2Tokenizer& gpt2() {
  static const std::unique_ptr<Gpt2Tokenizer> tok = std::make_unique<Gpt2Tokenizer>(repo_data_dir() + "/gpt2");
  return *tok;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Overwrites token `index` of the shard at `p` with `id` and recomputes the header's payload
// checksum: a shard that its checksum cannot fault, as a foreign writer could produce.
inline void write_token_and_reseal(const std::filesystem::path& p, uint64_t index, uint32_t id) {
  std::string bytes = read_bytes(p);
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  ShardHeader h = parse_shard_header(u, bytes.size(), p.string());
  std::memcpy(bytes.data() + kShardHeaderBytes + index * h.token_bytes, &id, h.token_bytes);  // little-endian
  h.checksum = fnv1a64(u + kShardHeaderBytes, bytes.size() - kShardHeaderBytes);
  write_shard_header(h, reinterpret_cast<unsigned char*>(bytes.data()));
  write_bytes(p, bytes);
}

// A fresh folder under the system temp dir, removed when the test ends.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("loom_data_" + std::to_string(::getpid()) + "_" + (info ? info->name() : "x"));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Runs f and returns the loom::Error message it throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace loom::data::testing
