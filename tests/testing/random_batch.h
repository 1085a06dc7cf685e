// Random tokens and targets for model tests: [B, T] each below V, with target 1 ignored (-1)
// so the loss's masking is always exercised.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace loom::testing {

inline void random_batch(int64_t B, int64_t T, int64_t V, std::vector<int32_t>& tok, std::vector<int32_t>& tgt,
                         unsigned seed) {
  std::mt19937 g(seed);
  tok.resize(size_t(B * T));
  tgt.resize(size_t(B * T));
  for (auto& t : tok) t = int32_t(g() % V);
  for (auto& t : tgt) t = int32_t(g() % V);
  tgt[1] = -1;
}

}  // namespace loom::testing
