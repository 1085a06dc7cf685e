// Batches for the equivalence tests under mpiexec: tokens are a pure function of (step,
// sequence, position), so any split of the global batch (data-parallel shards, pipeline
// micro-batches) sees the same data as the single process. Packed, each row holds documents of
// 1 to 7 tokens (their boundaries a function of the same), with positions restarting at each.
#pragma once
#include <cstdint>
#include "train/train_testing.h"

#include <cstdio>
#include <filesystem>
#include <string>

#include "loom/train/batch_source.h"
#include "loom/train/trainer.h"

namespace loom::testing {

class SyntheticSource final : public train::BatchSource {
 public:
  explicit SyntheticSource(int64_t vocab, bool packed = false) : vocab_(vocab), packed_(packed) {}
  void fill_train(int64_t step, int64_t first, int64_t n, int64_t, int64_t T, int32_t* tok, int32_t* tgt,
                  int32_t* pos) override {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t t = 0; t <= T; ++t) {
        const uint64_t h = (uint64_t(step) * 1000003u + uint64_t(first + r) * 7919u + uint64_t(t) * 31u) % 9973u;
        const int32_t id = int32_t((h * h + 17) % uint64_t(vocab_));
        if (t < T) tok[r * T + t] = id;
        if (t > 0) tgt[r * T + t - 1] = id;
        if (pos && t < T) pos[r * T + t] = t == 0 || h % 7 == 0 ? 0 : pos[r * T + t - 1] + 1;
      }
  }
  void fill_val(int64_t index, int64_t B, int64_t T, int32_t* tok, int32_t* tgt, int32_t* pos) override {
    fill_train(100000 + index, 0, B, B, T, tok, tgt, pos);
  }
  bool packs_documents() const override { return packed_; }
  int64_t vocab_size() const override { return vocab_; }
  bool has_val() const override { return true; }

 private:
  int64_t vocab_;
  bool packed_;
};

// A temporary directory every rank uses, emptied by rank 0 before anyone writes. Named per rank
// count: ctest may run the 2- and 4-rank suites at once.
inline std::string shared_empty_dir(const comm::Group& world, const std::string& stem) {
  const auto dir = std::filesystem::temp_directory_path() / (stem + "_" + std::to_string(world.size()));
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier();
  return dir.string();
}

}  // namespace loom::testing
