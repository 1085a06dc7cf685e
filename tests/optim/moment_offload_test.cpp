// Offloaded Adam moments (parallel.offload.optimizer): steps with the moments in the host pool
// or in a file, staged two pieces at a time (units cut where they are longer than a piece), give bitwise the weights
// and moments of the resident optimizer; whole moments read back and loaded (checkpoints) are those a resident run
// holds; the resident bytes are the staging buffers only; a directory that cannot hold the file is named.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>

#include "loom/core/error.h"
#include "loom/optim/sharded_adamw.h"
#include "testing/temp_dir.h"

using namespace loom;
using loom::testing::temp_dir;

namespace {

// Five units of uneven sizes (one empty, one larger than the rest) over a 1800-element buffer.
std::vector<optim::ShardedAdamW::Unit> units() {
  std::vector<optim::ShardedAdamW::Unit> u;
  int64_t at = 0;
  for (int64_t n : {300, 0, 900, 100, 500}) {
    u.push_back({at, n, comm::Group::single()});
    at += n;
  }
  return u;
}

struct Trained {
  std::vector<float> params, m, v;
};

// `steps` AdamW steps on random gradients (the same for every target), then the whole moments.
Trained run(optim::OffloadTarget target, const std::string& dir, int steps, const Trained* load = nullptr) {
  optim::AdamWConfig cfg;
  cfg.lr = 1e-2;
  optim::ShardedAdamW adam(cfg, units(), false, {{0, 1000, true}, {1000, 1800, false}});
  adam.offload(target, dir, 256);  // units cut into pieces of at most 256 elements
  const int64_t n = 1800;
  std::vector<float> p(static_cast<size_t>(n), 0.5f), g(static_cast<size_t>(n));
  if (load) {
    p = load->params;
    adam.load_full_moments(Tensor::from_vector<float>(load->m, {n}), Tensor::from_vector<float>(load->v, {n}), steps);
  }
  std::mt19937 rng(load ? 5 : 3);
  std::normal_distribution<float> d(0, 1);
  for (int s = 0; s < steps; ++s) {
    for (float& x : g) x = d(rng);
    adam.prefetch();
    for (size_t i = 0; i < adam.per_unit().size(); ++i) {
      const int64_t b = adam.unit(i).begin();
      adam.step_unit(i, p.data() + b, g.data() + b, 1e-2, 0.5);
    }
  }
  Tensor m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
  adam.gather_full_moments(m, v);
  return {p, m.to_f32_vector(), v.to_f32_vector()};
}

}  // namespace

TEST(MomentOffload, HostAndDiskStepLikeResidentMomentsBitwise) {
  const std::string dir = temp_dir("offload_steps");
  const Trained resident = run(optim::OffloadTarget::none, "", 4);
  for (auto target : {optim::OffloadTarget::host, optim::OffloadTarget::disk}) {
    SCOPED_TRACE(optim::offload_target_name(target));
    const Trained r = run(target, dir, 4);
    EXPECT_EQ(r.params, resident.params);
    EXPECT_EQ(r.m, resident.m);
    EXPECT_EQ(r.v, resident.v);
    // Loaded from a checkpoint's whole moments, three more steps as a resident run takes them.
    const Trained more = run(target, dir, 3, &r), more_resident = run(optim::OffloadTarget::none, "", 3, &resident);
    EXPECT_EQ(more.params, more_resident.params);
    EXPECT_EQ(more.m, more_resident.m);
  }
  // The steps did move the weights: the comparison can fail.
  EXPECT_NE(resident.params, std::vector<float>(1800, 0.5f));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the moments' file outlives its optimizer";
}

// A step that prefetched and never updated (a skipped non-finite step), then a checkpoint's
// whole read: the read drops the staged pieces, and the next step reads them again, so its
// update is the resident optimizer's.
TEST(MomentOffload, AReadBetweenPrefetchAndUpdateLeavesTheNextStepExact) {
  const std::string dir = temp_dir("offload_skip");
  const Trained resident = run(optim::OffloadTarget::none, "", 2);
  optim::AdamWConfig cfg;
  cfg.lr = 1e-2;
  optim::ShardedAdamW adam(cfg, units(), false, {{0, 1000, true}, {1000, 1800, false}});
  adam.offload(optim::OffloadTarget::disk, dir, 256);
  std::vector<float> p(1800, 0.5f), g(1800);
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0, 1);
  Tensor m = Tensor::zeros({1800}, DType::f32), v = Tensor::zeros({1800}, DType::f32);
  for (int s = 0; s < 2; ++s) {
    for (float& x : g) x = d(rng);
    adam.prefetch();
    adam.gather_full_moments(m, v);  // e.g. a checkpoint after a skipped step
    adam.prefetch();
    for (size_t i = 0; i < adam.per_unit().size(); ++i) {
      const int64_t b = adam.unit(i).begin();
      adam.step_unit(i, p.data() + b, g.data() + b, 1e-2, 0.5);
    }
  }
  adam.gather_full_moments(m, v);
  EXPECT_EQ(p, resident.params);
  EXPECT_EQ(m.to_f32_vector(), resident.m);
}

TEST(MomentOffload, OnlyTheStagingBuffersStayResident) {
  const std::string dir = temp_dir("offload_bytes");
  optim::ShardedAdamW adam(optim::AdamWConfig{}, units(), false, {{0, 1800, true}});
  const int64_t before = cpu_allocator().snapshot()[MemCategory::optimizer].current;
  adam.offload(optim::OffloadTarget::disk, dir);
  const int64_t after = cpu_allocator().snapshot()[MemCategory::optimizer].current;
  // Two staging buffers of the widest unit's m and v (900 each) replace 2 x 1800 moments.
  EXPECT_EQ(before - after, 2 * 1800 * 4 - 2 * 2 * 900 * 4);
  EXPECT_EQ(adam.offloaded()->offloaded_bytes(), 2 * 1800 * 4);
  EXPECT_EQ(adam.offloaded()->staged_bytes(), 2 * 2 * 900 * 4);
}

TEST(MomentOffload, AnUnwritableDirectoryIsNamed) {
  const std::string dir = temp_dir("offload_bad") + "/file";
  std::fclose(std::fopen(dir.c_str(), "w"));  // a file where the directory should be
  optim::ShardedAdamW adam(optim::AdamWConfig{}, units(), false, {{0, 1800, true}});
  try {
    adam.offload(optim::OffloadTarget::disk, dir);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[offload] cannot create " + dir + "/moments."), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("set parallel.offload.dir to a writable directory"), std::string::npos);
  }
}
