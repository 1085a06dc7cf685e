#include "loom/core/rng.h"

#include <cmath>

namespace loom {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(kM0) * c[0];
    uint64_t p1 = uint64_t(kM1) * c[2];
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

static std::array<uint32_t, 4> draw(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32({uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                    {uint32_t(seed), uint32_t(seed >> 32)});
}

float uniform01(uint64_t seed, uint64_t stream, uint64_t index) {
  return float(draw(seed, stream, index)[0] >> 8) * (1.0f / 16777216.0f);
}

double normal01(uint64_t seed, uint64_t stream, uint64_t index) {
  auto r = draw(seed, stream, index);
  // u1 in (0, 1], u2 in [0, 1), 53-bit-ish resolution from two words each.
  double u1 = (double((uint64_t(r[0]) << 21) ^ r[1]) + 1.0) / 9007199254740992.0;
  double u2 = double((uint64_t(r[2]) << 21) ^ r[3]) / 9007199254740992.0;
  u1 = std::fmin(u1, 1.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void fill_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, uint64_t first, float mean, float std) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = mean + std * float(normal01(seed, stream, first + uint64_t(i)));
}

uint64_t CounterRng::next_u64() {
  auto r = draw(seed_, stream_, next_++);
  return (uint64_t(r[0]) << 32) | r[1];
}

}  // namespace loom
