// Atomic writes: the final file appears complete, no temporary is left behind, an abandoned
// writer leaves no trace, replacing is atomic, and errors name the path.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "loom/core/error.h"
#include "loom/io/checksum.h"
#include "loom/io/file.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(::testing::TempDir()) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
size_t count_entries(const fs::path& d) {
  return size_t(std::distance(fs::directory_iterator(d), fs::directory_iterator()));
}
}  // namespace

TEST(AtomicFile, WritesReplacesAndLeavesNoTemporary) {
  const fs::path d = fresh_dir("loom_atomic_1");
  const std::string path = (d / "a.bin").string();
  io::write_file_atomic(path, "first version");
  EXPECT_EQ(io::read_file(path), "first version");
  io::write_file_atomic(path, "second");
  EXPECT_EQ(io::read_file(path), "second");
  EXPECT_EQ(count_entries(d), 1u);  // only a.bin: the temporary was renamed away
  io::fsync_dir(d.string());
}

TEST(AtomicFile, StreamingWriterTracksSizeAndChecksum) {
  const fs::path d = fresh_dir("loom_atomic_2");
  const std::string path = (d / "b.bin").string();
  io::AtomicFileWriter w(path);
  EXPECT_EQ(w.temp_path(), path + ".tmp." + std::to_string(::getpid()));
  w.write("1234");
  w.write("56789");
  EXPECT_FALSE(fs::exists(path));  // not visible before commit
  EXPECT_TRUE(fs::exists(w.temp_path()));
  w.commit();
  EXPECT_EQ(w.bytes_written(), 9u);
  EXPECT_EQ(w.crc32c(), 0xE3069283u);
  EXPECT_EQ(io::crc32c_file(path), w.crc32c());
  EXPECT_THROW(w.write("x"), Error);
}

TEST(AtomicFile, AbandonedWriterKeepsTheOldFile) {
  const fs::path d = fresh_dir("loom_atomic_3");
  const std::string path = (d / "c.bin").string();
  io::write_file_atomic(path, "good");
  {
    io::AtomicFileWriter w(path);
    w.write("half-written replacement");
    // Destroyed without commit, as when an exception unwinds a checkpoint save.
  }
  EXPECT_EQ(io::read_file(path), "good");
  EXPECT_EQ(count_entries(d), 1u);
}

TEST(AtomicFile, ErrorsNameThePath) {
  const std::string path = "/nonexistent_loom_dir/x.bin";
  try {
    io::write_file_atomic(path, "x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent_loom_dir/x.bin"), std::string::npos) << e.what();
  }
  EXPECT_THROW(io::fsync_dir("/nonexistent_loom_dir"), Error);
  EXPECT_THROW(io::read_file("/nonexistent_loom_dir/y"), Error);
}

TEST(MappedFile, MapsContentsAndEmptyFiles) {
  const fs::path d = fresh_dir("loom_map");
  const std::string path = (d / "m.bin").string();
  io::write_file_atomic(path, "mapped bytes");
  auto m = io::MappedFile::open(path);
  ASSERT_EQ(m->size(), 12u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), "mapped bytes");
  io::write_file_atomic(path, "");
  auto e = io::MappedFile::open(path);
  EXPECT_EQ(e->size(), 0u);
  EXPECT_THROW(io::MappedFile::open((d / "missing").string()), Error);
}
