// POSIX implementation of the atomic writer, directory fsync and read-only mapping.
// Every error names the file and the OS reason.
#include "loom/io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/io/checksum.h"

namespace loom::io {

namespace {

std::string os_error() { return std::strerror(errno); }

std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), tmp_(str_cat(path_, ".tmp.", ::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("io", tmp_, ": cannot create (writing ", path_, "): ", os_error());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t n) {
  LOOM_CHECK(fd_ >= 0 && !committed_, "io", path_, ": write after commit");
  crc_ = crc32c_extend(crc_, data, n);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("io", tmp_, ": write failed after ", bytes_, " bytes: ", os_error());
    }
    p += w;
    n -= size_t(w);
    bytes_ += uint64_t(w);
  }
}

void AtomicFileWriter::commit() {
  LOOM_CHECK(fd_ >= 0 && !committed_, "io", path_, ": commit called twice");
  if (::fsync(fd_) != 0) fail("io", tmp_, ": fsync failed: ", os_error());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("io", tmp_, ": close failed: ", os_error());
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("io", "cannot rename ", tmp_, " to ", path_, ": ", os_error());
  committed_ = true;
  fsync_dir(parent_dir(path_));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter w(path);
  w.write(bytes);
  w.commit();
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("io", dir, ": cannot open directory to fsync: ", os_error());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? os_error() : "";
  ::close(fd);
  if (rc != 0) fail("io", dir, ": directory fsync failed: ", why);
}

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("io", path, ": cannot open: ", os_error());
  std::string out;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, got);
  const bool bad = std::ferror(f) != 0;
  const std::string why = bad ? os_error() : "";
  std::fclose(f);
  if (bad) fail("io", path, ": read error: ", why);
  return out;
}

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path, const char* where, const std::string& fix,
                                                   bool writable) {
  const std::string then = fix.empty() ? "" : "; " + fix;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(where, "cannot open ", path, ": ", os_error(), then);
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    const std::string why = stat_ok ? "not a regular file" : os_error();
    ::close(fd);
    fail(where, "cannot open ", path, ": ", why, then);
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = size_t(st.st_size);
  if (m->size_ > 0) {  // mmap rejects a zero length; an empty file maps to nothing
    void* p = ::mmap(nullptr, m->size_, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = os_error();
      ::close(fd);
      fail(where, "cannot map ", path, " (", m->size_, " bytes): ", why, then);
    }
    m->data_ = static_cast<unsigned char*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  return m;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

}  // namespace loom::io
