// Crash-safe file output and read-only mapping. A file written here appears under its final
// name only when complete and on disk: bytes go to "<path>.tmp.<pid>", which is fsynced,
// renamed over <path>, and then the directory is fsynced so the rename itself survives a crash.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace loom::io {

// Streams bytes to a temporary file and publishes it atomically on commit(); destroying an
// uncommitted writer removes the temporary, so an exception midway leaves no trace.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);  // throws "[io] <path>: ..." if it cannot create
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // fsync, close, rename onto the final path, fsync the directory.
  void commit();

  uint64_t bytes_written() const { return bytes_; }
  uint32_t crc32c() const { return crc_; }  // of everything written so far (for manifests)
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
  bool committed_ = false;
};

// The whole-buffer form of AtomicFileWriter.
void write_file_atomic(const std::string& path, std::string_view bytes);
// Makes completed renames/creations in `dir` durable. Throws "[io] <dir>: ..." on failure.
void fsync_dir(const std::string& dir);
// Whole file into memory. Throws "[io] <path>: ..." naming the OS error.
std::string read_file(const std::string& path);

// A private memory map of a whole file (safetensors weights, token shards, `loom prepare`'s
// inputs), shared so that tensors borrowing it keep it alive. Read-only by default. `writable`
// maps the pages copy-on-write: a write through a borrowed tensor stays in this process and
// never reaches the file (so a Tensor view of it is safe to mutate); the kernel then counts the
// whole size against its commit limit, which a read-only map of a huge token shard avoids.
// An empty file maps to an empty view.
class MappedFile {
 public:
  // Throws "[where] cannot open <path>: <reason>; <fix>" (the fix only when given) when the
  // path cannot be opened, is not a regular file, or cannot be mapped.
  static std::shared_ptr<const MappedFile> open(const std::string& path, const char* where = "io",
                                                const std::string& fix = "", bool writable = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace loom::io
