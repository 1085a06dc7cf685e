// Sampling parameters and the sampler: greedy, temperature, top-k, top-p. A draw is a pure
// function of (request seed, output position), from loom's counter-based RNG, so a request's
// tokens never depend on what else shares its batch.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::infer {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // in (0, 1]
  int64_t max_tokens = 16;   // tokens to generate at most
  std::vector<int32_t> stop_token_ids;  // end the output (the stop token is not part of it)
  std::vector<std::string> stop;        // end once the detokenised output contains one
  std::optional<uint64_t> seed;         // unset: the engine derives one from its own seed

  // Throws "[sampling] <parameter> ..." naming the bad parameter.
  void validate() const;
  bool greedy() const { return temperature == 0.0; }
};

// The uniform draw for output position `index` of a request with this seed.
float sampling_draw(uint64_t seed, int64_t index);

// Picks a token from one row of logits given a uniform draw u in [0, 1). Ties break toward
// the lower token ID. `scratch` is reused between calls to avoid allocating.
template <class T>
int32_t sample_token(const T* logits, int64_t V, const SamplingParams& p, float u,
                     std::vector<std::pair<T, int32_t>>& scratch);

}  // namespace loom::infer
