// A read-only memory map of a whole file (POSIX mmap), move-only. Used for token shards and
// for `loom prepare`'s inputs so neither is copied into memory.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace loom::data {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws "[where] cannot open <path>: <reason>; <fix>" when the file cannot be mapped.
  MappedFile(const std::string& path, const char* where, const char* fix);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace loom::data
