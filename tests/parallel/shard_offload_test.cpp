// ZeRO-3's offloaded parameter chunks (parallel/shard_offload.h), in the host pool and in a file:
// what is written reads back, a read asked after a write of the same range sees the write even
// when an older read of it was staged, reads staged ahead are the ones taken, dropping staged
// ranges waits for the I/O thread and forgets them, the store's bytes count as offloaded (host)
// and the staged copies as parameters, and a directory that cannot hold the file is named.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <numeric>
#include <vector>

#include "loom/core/allocator.h"
#include "loom/core/error.h"
#include "loom/parallel/shard_offload.h"
#include "testing/temp_dir.h"

using namespace loom;
using loom::testing::temp_dir;

namespace {

std::vector<float> values(const Tensor& t) { return t.to_f32_vector(); }

class ShardOffloadTarget : public ::testing::TestWithParam<optim::OffloadTarget> {};

TEST_P(ShardOffloadTarget, ReadsSeeWritesInTheOrderTheyWereAsked) {
  const std::string dir = temp_dir("shard_offload");
  {
    parallel::ShardOffload s(GetParam(), dir, 1000);
    EXPECT_EQ(s.offloaded_bytes(), 4000);
    std::vector<float> init(1000);
    std::iota(init.begin(), init.end(), 0.0f);
    s.write(0, 1000, init.data());
    // Staged ahead, then taken: the stored values.
    s.prefetch(100, 50);
    s.prefetch(100, 50);  // already on its way: nothing more
    const Tensor a = s.take(100, 50);
    EXPECT_EQ(values(a), std::vector<float>(init.begin() + 100, init.begin() + 150));
    // Updated and written back while a stale read of the same range is staged: the next take reads
    // after the write.
    s.prefetch(300, 10);
    Tensor b = s.take(300, 10);
    b.data<float>()[0] = -1.0f;
    s.prefetch(300, 10);  // staged before the write: must not be what the next take returns
    s.write_back(300, b);
    const Tensor c = s.take(300, 10);
    EXPECT_EQ(c.data<float>()[0], -1.0f);
    EXPECT_EQ(c.data<float>()[1], 301.0f);
    // Never staged: read on the spot.
    EXPECT_EQ(values(s.take(990, 10)), std::vector<float>(init.begin() + 990, init.end()));
    // Staged ranges nobody takes are dropped; the synchronous read sees every write.
    s.prefetch(500, 100);
    s.drop_staged();
    std::vector<float> back(1000);
    s.read(0, 1000, back.data());
    init[300] = -1.0f;
    EXPECT_EQ(back, init);
  }
  if (GetParam() == optim::OffloadTarget::disk) {
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the file outlived its store";
  }
  std::filesystem::remove_all(dir);
}

TEST_P(ShardOffloadTarget, StagedCopiesAreParametersAndTheStoreIsOffloaded) {
  const std::string dir = temp_dir("shard_offload_bytes");
  Allocator& a = cpu_allocator();
  const int64_t params0 = a.snapshot()[MemCategory::params].current;
  const int64_t offloaded0 = a.snapshot()[MemCategory::offloaded].current;
  {
    parallel::ShardOffload s(GetParam(), dir, 1 << 16);
    const bool host = GetParam() == optim::OffloadTarget::host;
    EXPECT_EQ(a.snapshot()[MemCategory::offloaded].current - offloaded0, host ? 4 << 16 : 0);
    EXPECT_EQ(a.snapshot()[MemCategory::params].current, params0);
    const Tensor t = s.take(0, 1024);
    EXPECT_EQ(a.snapshot()[MemCategory::params].current - params0, 4096);
  }
  EXPECT_EQ(a.snapshot()[MemCategory::params].current, params0);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(HostAndDisk, ShardOffloadTarget,
                         ::testing::Values(optim::OffloadTarget::host, optim::OffloadTarget::disk),
                         [](const auto& info) { return std::string(optim::offload_target_name(info.param)); });

TEST(ShardOffload, AnUnwritableDirectoryIsNamed) {
  const std::string file = temp_dir("shard_offload_file") + "/not-a-dir";
  std::fclose(std::fopen(file.c_str(), "w"));
  try {
    parallel::ShardOffload s(optim::OffloadTarget::disk, file, 10);
    FAIL() << "a file as parallel.offload.dir was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("for the parameter shards"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("set parallel.offload.dir to a writable directory"), std::string::npos);
  }
}

}  // namespace
