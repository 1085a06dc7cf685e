// Sampling: validation of the parameters and the token choice (temperature softmax, then top-k
// and top-p truncation, then inverse-CDF with the request's counter-based draw).
#include "loom/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/infer/wire.h"
#include "loom/kernels/cpu/vec_math.h"

namespace loom::infer {

// Stream id of sampling draws ("sampling" hashed), apart from any parameter-init stream.
static constexpr uint64_t kSamplingStream = 0x73616d706c696e67ull;

void write_sampling_params(ByteWriter& w, const SamplingParams& p) {
  // The bindings name every field: one more field in SamplingParams is a compile error here.
  const auto& [temperature, top_k, top_p, max_tokens, stop_token_ids, stop, seed, speculate, token_probs] = p;
  w.put(temperature);
  w.put(top_k);
  w.put(top_p);
  w.put(max_tokens);
  w.put_vec(stop_token_ids);
  w.put(int64_t(stop.size()));
  for (const std::string& s : stop) w.put_str(s);
  w.put(uint8_t(seed.has_value()));
  w.put(seed.value_or(0));
  w.put(uint8_t(speculate));
  w.put(uint8_t(token_probs));
}

SamplingParams read_sampling_params(ByteReader& r) {
  SamplingParams p;
  auto& [temperature, top_k, top_p, max_tokens, stop_token_ids, stop, seed, speculate, token_probs] = p;
  temperature = r.get<double>();
  top_k = r.get<int64_t>();
  top_p = r.get<double>();
  max_tokens = r.get<int64_t>();
  stop_token_ids = r.get_vec<int32_t>();
  const int64_t n_stop = r.get<int64_t>();
  for (int64_t i = 0; i < n_stop; ++i) stop.push_back(r.get_str());
  const bool has_seed = r.get<uint8_t>() != 0;
  const uint64_t seed_value = r.get<uint64_t>();
  if (has_seed) seed = seed_value;
  speculate = r.get<uint8_t>() != 0;
  token_probs = r.get<uint8_t>() != 0;
  return p;
}

void SamplingParams::validate() const {
  LOOM_CHECK(std::isfinite(temperature) && temperature >= 0.0, "sampling",
             "temperature must be >= 0 (0 means greedy), got ", temperature);
  LOOM_CHECK(top_k >= 0, "sampling", "top_k must be >= 0 (0 disables it), got ", top_k);
  LOOM_CHECK(top_p > 0.0 && top_p <= 1.0, "sampling", "top_p must lie in (0, 1], got ", top_p);
  LOOM_CHECK(max_tokens >= 1, "sampling", "max_tokens must be at least 1, got ", max_tokens);
  for (const auto& s : stop) LOOM_CHECK(!s.empty(), "sampling", "stop strings must not be empty");
  for (int32_t t : stop_token_ids) LOOM_CHECK(t >= 0, "sampling", "stop_token_ids must be token IDs >= 0, got ", t);
}

std::string temperature_problem(double t, std::string_view name) {
  if (t >= 0.0 && t <= 2.0) return "";
  return str_cat(name, " must be between 0 and 2 (0: greedy), got ", t);
}

std::string top_p_problem(double p, std::string_view name) {
  if (p > 0.0 && p <= 1.0) return "";
  return str_cat(name, " must be greater than 0 and at most 1, got ", p);
}

std::string top_k_problem(int64_t k, std::string_view name) {
  if (k >= -1) return "";
  return str_cat(name, " must be a positive integer, or 0 or -1 for no limit, got ", k);
}

std::string max_tokens_problem(int64_t n, std::string_view name) {
  if (n >= 1) return "";
  return str_cat(name, " must be at least 1, got ", n);
}

float sampling_draw(uint64_t seed, int64_t index) { return uniform01(seed, kSamplingStream, uint64_t(index)); }

namespace {

// A logit's softmax weight relative to the maximum at temperature 1 / inv_t: f32 through the
// branch-free exp of kernels/cpu/vec_math.h (about 2 ulp; loops over it vectorise), f64 through
// libm.
// The exponent is formed in double (a temperature below ~3e-39 would overflow a float 1 / T);
// below exp_f32's range (-87.3, where it clamps instead of returning 0) the weight is exactly 0,
// as a masked (-inf) logit's must be.
template <class T>
inline T weight_of(T logit, T mx, double inv_t) {
  if constexpr (std::is_same_v<T, float>) {
    const float x = float(double(logit - mx) * inv_t);
    return x < -87.3f ? 0.f : cpu::exp_f32(x);
  } else {
    return std::exp((logit - mx) * inv_t);
  }
}

// A row can be sampled when no logit is NaN or +inf and the largest is above -inf. The first
// is or-ed over the row within a pass each path makes anyway (into an int: a bool accumulator
// keeps GCC from vectorising the top-k copy loop).
template <class T>
inline int nan_or_inf(T x) {
  return !(x < std::numeric_limits<T>::infinity());  // a NaN compares false
}
template <class T>
inline bool above_minus_inf(T x) {
  return x > -std::numeric_limits<T>::infinity();
}

// The largest logit, and whether the row can be sampled.
template <class T>
struct RowMax {
  T value;
  bool sampleable;
};
template <class T>
inline RowMax<T> max_of(const T* x, int64_t n) {
  T mx = x[0];
  int bad = nan_or_inf(x[0]);
  for (int64_t i = 1; i < n; ++i) {
    mx = x[i] > mx ? x[i] : mx;
    bad |= nan_or_inf(x[i]);
  }
  return {mx, !bad && above_minus_inf(mx)};
}

// Plain temperature sampling (no top-k, no top-p): inverse CDF over the vocabulary in ID order,
// no ordering needed. One vectorised pass for the weights and their total (eight interleaved
// partial sums), one for the draw.
template <class T>
int32_t sample_plain(const T* logits, int64_t V, double inv_t, float u) {
  static thread_local std::vector<T> w;
  const RowMax<T> row = max_of(logits, V);
  if (!row.sampleable) return kNonFiniteLogits;
  const T mx = row.value;
  w.resize(size_t(V));
  T* wp = w.data();
  for (int64_t i = 0; i < V; ++i) wp[i] = weight_of(logits[i], mx, inv_t);
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= V; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += double(wp[i + k]);
  for (; i < V; ++i) acc[0] += double(wp[i]);
  const double total = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  const double r = double(u) * total;
  double cum = 0;
  int64_t last = 0;  // the last token with weight: rounding can leave r at or past the sum
  for (int64_t j = 0; j < V; ++j) {
    if (wp[j] == T(0)) continue;
    cum += double(wp[j]);
    last = j;
    if (r < cum) return int32_t(j);
  }
  return int32_t(last);
}

}  // namespace

// Top-p without top-k. Sorting the whole vocabulary per token (50257 entries for GPT-2, ~4 ms) is
// not needed: the nucleus is a prefix of the sorted order. One pass buckets the tokens by how far
// their logit lies below the maximum (bands of half a temperature, so band order is logit order)
// and sums each band's mass; the bands that together reach top_p of the total hold the whole
// nucleus, and only their tokens are sorted. Same prefix and draw as a full sort; only the total
// is summed in vocabulary order instead of sorted order.
template <class T, class Before>
int32_t sample_nucleus(const T* logits, int64_t V, const SamplingParams& p, float u,
                       std::vector<std::pair<T, int32_t>>& scratch, const Before& before) {
  constexpr int kBands = 128;
  const RowMax<T> row = max_of(logits, V);
  if (!row.sampleable) return kNonFiniteLogits;
  const T mx = row.value;
  const double inv_t = 1.0 / p.temperature;
  auto weight = [&](T logit) { return weight_of(logit, mx, inv_t); };
  auto band = [&](T logit) {
    const double b = double(mx - logit) * inv_t * 2.0;
    return b < double(kBands - 1) ? int(b) : kBands - 1;
  };
  double total = 0, mass[kBands] = {};
  for (int64_t i = 0; i < V; ++i) {
    const double w = double(weight(logits[i]));
    total += w;
    mass[band(logits[i])] += w;
  }
  // Bands up to `last` reach the target with room for rounding; if the sorted prefix still
  // falls short (sums in another order), the next round takes every token.
  const double target = p.top_p * total;
  int last = 0;
  for (double m = mass[0]; last < kBands - 1 && m < target * (1 + 1e-9); m += mass[++last]) {
  }
  for (int round = 0; round < 2; ++round, last = kBands - 1) {
    size_t n = 0;
    for (int64_t i = 0; i < V; ++i)
      if (band(logits[i]) <= last) scratch[n++] = {logits[i], int32_t(i)};
    std::sort(scratch.begin(), scratch.begin() + long(n), before);
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
      scratch[i].first = weight(scratch[i].first);
      cum += double(scratch[i].first);
      if (cum >= target || (i + 1 == n && last == kBands - 1)) {
        const double r = double(u) * cum;
        double c = 0;
        for (size_t j = 0; j <= i; ++j) {
          c += double(scratch[j].first);
          if (r < c) return scratch[j].second;
        }
        return scratch[i].second;
      }
    }
  }
  return scratch[0].second;  // not reached: the last round includes every token
}

template <class T>
int32_t sample_token(const T* logits, int64_t V, const SamplingParams& p, float u,
                     std::vector<std::pair<T, int32_t>>& scratch) {
  if (p.greedy()) {
    int64_t best = 0;
    int bad = nan_or_inf(logits[0]);
    for (int64_t i = 1; i < V; ++i) {
      if (logits[i] > logits[best]) best = i;
      bad |= nan_or_inf(logits[i]);
    }
    return !bad && above_minus_inf(logits[best]) ? int32_t(best) : kNonFiniteLogits;
  }
  // Higher logit first; equal logits by lower ID, so the order is total and deterministic.
  auto before = [](const std::pair<T, int32_t>& a, const std::pair<T, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const bool use_k = p.top_k > 0 && p.top_k < V;
  if (!use_k && p.top_p >= 1.0) return sample_plain(logits, V, 1.0 / p.temperature, u);
  scratch.resize(size_t(V));
  if (!use_k && p.top_p < 1.0) return sample_nucleus(logits, V, p, u, scratch, before);
  // Top-k (and top-p within it): the k largest logits, in order. (A NaN would also break the
  // ordering the selection needs.)
  int bad = 0;
  for (int64_t i = 0; i < V; ++i) {
    scratch[size_t(i)] = {logits[i], int32_t(i)};
    bad |= nan_or_inf(logits[i]);
  }
  if (bad) return kNonFiniteLogits;
  std::nth_element(scratch.begin(), scratch.begin() + (p.top_k - 1), scratch.end(), before);
  scratch.resize(size_t(p.top_k));
  std::sort(scratch.begin(), scratch.end(), before);
  const T mx = scratch[0].first;
  if (!above_minus_inf(mx)) return kNonFiniteLogits;
  const double inv_t = 1.0 / p.temperature;
  double total = 0;
  for (auto& c : scratch) {
    c.first = weight_of(c.first, mx, inv_t);
    total += double(c.first);
  }
  size_t n = scratch.size();
  if (p.top_p < 1.0) {
    // Smallest high-probability prefix whose mass reaches top_p (Holtzman et al. 2020).
    double cum = 0;
    for (size_t i = 0; i < scratch.size(); ++i) {
      cum += double(scratch[i].first);
      if (cum >= p.top_p * total) {
        n = i + 1;
        total = cum;
        break;
      }
    }
  }
  const double r = double(u) * total;
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += double(scratch[i].first);
    if (r < cum) return scratch[i].second;
  }
  return scratch[n - 1].second;
}

template <class T>
bool sampling_distribution(const T* logits, int64_t V, const SamplingParams& p, std::vector<double>& probs,
                           std::vector<std::pair<T, int32_t>>& scratch) {
  probs.assign(size_t(V), 0.0);
  if (p.greedy()) {
    const int32_t t = sample_token(logits, V, p, 0.f, scratch);
    if (t == kNonFiniteLogits) return false;
    probs[size_t(t)] = 1.0;
    return true;
  }
  const RowMax<T> row = max_of(logits, V);
  if (!row.sampleable) return false;
  const double inv_t = 1.0 / p.temperature;
  const bool use_k = p.top_k > 0 && p.top_k < V;
  if (!use_k && p.top_p >= 1.0) {
    double total = 0;
    for (int64_t i = 0; i < V; ++i) total += probs[size_t(i)] = double(weight_of(logits[i], row.value, inv_t));
    for (double& x : probs) x /= total;
    return true;
  }
  // The candidates in sample_token's order: higher logit first, equal logits by lower ID.
  scratch.resize(size_t(V));
  for (int64_t i = 0; i < V; ++i) scratch[size_t(i)] = {logits[i], int32_t(i)};
  auto before = [](const std::pair<T, int32_t>& a, const std::pair<T, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = size_t(V);
  if (use_k) {
    std::nth_element(scratch.begin(), scratch.begin() + (p.top_k - 1), scratch.end(), before);
    n = size_t(p.top_k);
  }
  std::sort(scratch.begin(), scratch.begin() + long(n), before);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += double(weight_of(scratch[i].first, row.value, inv_t));
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = double(weight_of(scratch[i].first, row.value, inv_t));
    cum += w;
    probs[size_t(scratch[i].second)] = w;
    if (p.top_p < 1.0 && cum >= p.top_p * total) break;
  }
  for (double& x : probs) x /= cum;
  return true;
}

int32_t draw_from(std::span<const double> weights, float u) {
  double total = 0;
  for (double w : weights) total += w;
  const double r = double(u) * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0) continue;
    cum += weights[i];
    last = int32_t(i);
    if (r < cum) return last;
  }
  return last;
}

template bool sampling_distribution<float>(const float*, int64_t, const SamplingParams&, std::vector<double>&,
                                           std::vector<std::pair<float, int32_t>>&);
template bool sampling_distribution<double>(const double*, int64_t, const SamplingParams&, std::vector<double>&,
                                            std::vector<std::pair<double, int32_t>>&);

template <class T>
std::string describe_non_finite(const T* logits, int64_t V) {
  bool pos_inf = false;
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(logits[i])) return "NaN";
    pos_inf |= logits[i] == std::numeric_limits<T>::infinity();
  }
  return pos_inf ? "+inf" : "-inf for every token";
}

template <class T>
double token_probability(const T* logits, int64_t V, int32_t tok) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - mx);
  return std::exp(double(logits[tok]) - mx) / sum;
}

template double token_probability<float>(const float*, int64_t, int32_t);
template double token_probability<double>(const double*, int64_t, int32_t);
template std::string describe_non_finite<float>(const float*, int64_t);
template std::string describe_non_finite<double>(const double*, int64_t);
template int32_t sample_token<float>(const float*, int64_t, const SamplingParams&, float,
                                     std::vector<std::pair<float, int32_t>>&);
template int32_t sample_token<double>(const double*, int64_t, const SamplingParams&, float,
                                      std::vector<std::pair<double, int32_t>>&);

}  // namespace loom::infer
