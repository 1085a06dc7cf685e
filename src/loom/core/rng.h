// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): every value is a pure
// function of (seed, stream, index), so initial weights do not depend on how parameters are
// later sharded, and a sampler's draws do not depend on what else runs in the batch.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

namespace loom {

// Philox4x32 with 10 rounds: four 32-bit outputs for a 128-bit counter and a 64-bit key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// SplitMix64's finaliser (Steele et al., OOPSLA'14): a cheap, well-mixed 64-bit bijection,
// for deriving seeds and chaining hashes.
inline uint64_t splitmix64_mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Stable 64-bit FNV-1a hash of a name, used as the stream of a parameter.
uint64_t hash_name(std::string_view name);

// Uniform in [0, 1) with 24 random bits, for (seed, stream, index).
float uniform01(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal (Box-Muller on two 32-bit uniforms) for (seed, stream, index).
double normal01(uint64_t seed, uint64_t stream, uint64_t index);

// out[i] = mean + std * normal01(seed, stream, first_index + i).
void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t first_index, float mean, float std);

// A small sequential generator over the counter-based stream: draw k uses index k.
class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}
  float uniform() { return uniform01(seed_, stream_, next_++); }
  double normal() { return normal01(seed_, stream_, next_++); }
  uint64_t next_u64();
  uint64_t position() const { return next_; }
  void set_position(uint64_t p) { next_ = p; }

 private:
  uint64_t seed_, stream_, next_ = 0;
};

}  // namespace loom
