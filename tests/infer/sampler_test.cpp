// The sampler alone: greedy and its tie-break, top-k and top-p truncation, draws that follow
// the softmax, and draws that depend only on (seed, position).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "loom/infer/sampler.h"
#include "loom/infer/wire.h"
#include "loom/kernels/cpu/vec_math.h"

using namespace loom::infer;

TEST(Sampler, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  std::vector<std::pair<float, int32_t>> scratch;
  SamplingParams p;
  p.temperature = 0;
  const std::vector<float> l{0.1f, 2.f, -1.f, 2.f};
  EXPECT_EQ(sample_token(l.data(), 4, p, 0.99f, scratch), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  std::vector<std::pair<float, int32_t>> scratch;
  const std::vector<float> l{0.3f, 0.1f, 0.5f, 0.45f};
  SamplingParams k1;
  k1.top_k = 1;
  SamplingParams p0;
  p0.top_p = 1e-6;
  for (float u : {0.f, 0.3f, 0.999f}) {
    EXPECT_EQ(sample_token(l.data(), 4, k1, u, scratch), 2);
    EXPECT_EQ(sample_token(l.data(), 4, p0, u, scratch), 2);
  }
}

TEST(Sampler, DrawsFollowTheTruncatedSoftmax) {
  std::vector<std::pair<double, int32_t>> scratch;
  const std::vector<double> l{std::log(0.1), std::log(0.2), std::log(0.3), std::log(0.4)};
  auto freq = [&](const SamplingParams& p) {
    std::vector<double> f(4, 0.0);
    const int n = 20000;
    for (int i = 0; i < n; ++i) f[size_t(sample_token(l.data(), 4, p, sampling_draw(9, i), scratch))] += 1.0 / n;
    return f;
  };
  SamplingParams plain;
  auto f = freq(plain);
  for (int v = 0; v < 4; ++v) EXPECT_NEAR(f[size_t(v)], 0.1 * (v + 1), 0.015) << v;
  SamplingParams k2;
  k2.top_k = 2;  // keeps 0.3 and 0.4
  f = freq(k2);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[3], 0.4 / 0.7, 0.015);
  SamplingParams p6;
  p6.top_p = 0.6;  // 0.4 + 0.3 reaches 0.6
  f = freq(p6);
  EXPECT_EQ(f[0] + f[1], 0.0);
  EXPECT_NEAR(f[2], 0.3 / 0.7, 0.015);
  SamplingParams hot;
  hot.temperature = 2.0;  // flattens: p ~ sqrt(0.1 .. 0.4)
  f = freq(hot);
  double z = 0;
  for (int v = 0; v < 4; ++v) z += std::sqrt(0.1 * (v + 1));
  for (int v = 0; v < 4; ++v) EXPECT_NEAR(f[size_t(v)], std::sqrt(0.1 * (v + 1)) / z, 0.015);
}

// Top-p by sorting the whole vocabulary, as the sampler did before it sorted only the nucleus's
// bands: the same token (only the total's summation order differs, a last-bit effect).
static int32_t nucleus_by_full_sort(const std::vector<float>& logits, double top_p, double temp, float u) {
  std::vector<std::pair<float, int32_t>> s;
  for (size_t i = 0; i < logits.size(); ++i) s.push_back({logits[i], int32_t(i)});
  std::sort(s.begin(), s.end(),
            [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  const float mx = s[0].first;
  double total = 0;
  const double inv_t = 1.0 / temp;
  for (auto& c : s) {  // the sampler's weight
    const float x = float(double(c.first - mx) * inv_t);
    total += double(c.first = x < -87.3f ? 0.f : loom::cpu::exp_f32(x));
  }
  double cum = 0;
  size_t n = s.size();
  for (size_t i = 0; i < s.size(); ++i)
    if ((cum += s[i].first) >= top_p * total) {
      n = i + 1;
      break;
    }
  const double r = double(u) * (n == s.size() ? total : cum);
  double c = 0;
  for (size_t i = 0; i < n; ++i)
    if (r < (c += s[i].first)) return s[i].second;
  return s[n - 1].second;
}

TEST(Sampler, TopPPicksWhatAFullSortPicks) {
  std::vector<std::pair<float, int32_t>> scratch;
  std::mt19937 gen(3);
  for (double spread : {0.05, 1.0, 4.0}) {  // nearly flat (nucleus of thousands) to peaked
    std::normal_distribution<float> nd(0.f, float(spread));
    std::vector<float> l(50257);
    for (auto& x : l) x = nd(gen);
    l[123] = l[77];  // a tie, broken by the lower ID
    for (double top_p : {0.05, 0.5, 0.9, 0.999}) {
      SamplingParams p;
      p.top_p = top_p;
      p.temperature = 0.8;
      for (int d = 0; d < 12; ++d) {
        const float u = sampling_draw(11, d);
        EXPECT_EQ(sample_token(l.data(), int64_t(l.size()), p, u, scratch), nucleus_by_full_sort(l, top_p, 0.8, u))
            << "spread " << spread << " top_p " << top_p << " draw " << d;
      }
    }
  }
  // Edges: one token; top_p just below 1 (the nucleus is nearly everything); -inf logits (a
  // masked vocabulary) and one logit far above the rest.
  SamplingParams p;
  p.temperature = 0.8;
  p.top_p = 0.5;
  const std::vector<float> one{0.3f};
  EXPECT_EQ(sample_token(one.data(), 1, p, 0.7f, scratch), 0);
  std::vector<float> l(3000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i)));
  for (size_t i = 0; i < l.size(); i += 3) l[i] = -INFINITY;
  for (double top_p : {0.5, 1 - 1e-12}) {
    p.top_p = top_p;
    for (int d = 0; d < 12; ++d) {
      const float u = sampling_draw(12, d);
      EXPECT_EQ(sample_token(l.data(), int64_t(l.size()), p, u, scratch), nucleus_by_full_sort(l, top_p, 0.8, u))
          << "top_p " << top_p << " draw " << d;
    }
  }
  l[17] = 60.f;  // about all the mass: the first band holds the nucleus
  EXPECT_EQ(sample_token(l.data(), int64_t(l.size()), p, 0.99f, scratch), 17);
  // A masked token has weight exactly 0: never drawn, not even by u = 0, with or without top-p;
  // and a temperature too small for a float 1 / T still picks the maximum.
  for (double top_p : {1.0, 0.5}) {
    p.top_p = top_p;
    EXPECT_NE(sample_token(l.data(), int64_t(l.size()), p, 0.f, scratch), 0) << top_p;
    SamplingParams cold = p;
    cold.temperature = 1e-40;
    EXPECT_EQ(sample_token(l.data(), int64_t(l.size()), cold, 0.5f, scratch), 17) << top_p;
  }
}

TEST(Sampler, DrawsArePureFunctionsOfSeedAndPosition) {
  EXPECT_EQ(sampling_draw(5, 17), sampling_draw(5, 17));
  EXPECT_NE(sampling_draw(5, 17), sampling_draw(5, 18));
  EXPECT_NE(sampling_draw(5, 17), sampling_draw(6, 17));
}

TEST(Sampler, ValidationNamesTheParameter) {
  auto msg = [](SamplingParams p) {
    try {
      p.validate();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SamplingParams p;
  EXPECT_EQ(msg(p), "");
  p.temperature = -1;
  EXPECT_EQ(msg(p).rfind("[sampling] temperature", 0), 0u);
  p = {};
  p.top_k = -3;
  EXPECT_EQ(msg(p).rfind("[sampling] top_k", 0), 0u);
  p = {};
  p.top_p = 1.01;
  EXPECT_EQ(msg(p).rfind("[sampling] top_p", 0), 0u);
  p.top_p = std::nan("");
  EXPECT_EQ(msg(p).rfind("[sampling] top_p", 0), 0u);
  p = {};
  p.stop_token_ids = {-2};
  EXPECT_EQ(msg(p).rfind("[sampling] stop_token_ids", 0), 0u);
}

TEST(Sampler, RowsWithNanOrInfinityAreRefusedOnEveryPath) {
  std::vector<std::pair<float, int32_t>> scratch;
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams greedy, plain, top_k, top_p, both;
  greedy.temperature = 0;
  top_k.top_k = 2;
  top_p.top_p = 0.9;
  both.top_k = 3;
  both.top_p = 0.5;
  const std::vector<float> masked{0.5f, -inf, 1.5f, 0.2f};  // a -inf logit is a masked token
  for (const SamplingParams& p : {greedy, plain, top_k, top_p, both}) {
    for (size_t at = 0; at < 4; ++at) {
      std::vector<float> l{0.5f, 1.f, 1.5f, 0.2f};
      l[at] = std::nanf("");
      EXPECT_EQ(sample_token(l.data(), 4, p, 0.3f, scratch), kNonFiniteLogits) << at;
      EXPECT_EQ(describe_non_finite(l.data(), 4), "NaN");
      l[at] = inf;
      EXPECT_EQ(sample_token(l.data(), 4, p, 0.3f, scratch), kNonFiniteLogits) << at;
      EXPECT_EQ(describe_non_finite(l.data(), 4), "+inf");
    }
    const std::vector<float> none(4, -inf);
    EXPECT_EQ(sample_token(none.data(), 4, p, 0.3f, scratch), kNonFiniteLogits);
    EXPECT_EQ(describe_non_finite(none.data(), 4), "-inf for every token");
    const int32_t t = sample_token(masked.data(), 4, p, 0.3f, scratch);
    EXPECT_TRUE(t == 0 || t == 2 || t == 3) << t;
  }
  std::vector<std::pair<double, int32_t>> scratch64;
  const std::vector<double> l64{0.1, std::nan(""), 0.3};
  EXPECT_EQ(sample_token(l64.data(), 3, plain, 0.3f, scratch64), kNonFiniteLogits);
}

TEST(Sampler, UserRangesAreSharedAndNamedAsTheCallerSpellsThem) {
  EXPECT_EQ(temperature_problem(0, "--temperature"), "");
  EXPECT_EQ(temperature_problem(2, "--temperature"), "");
  EXPECT_EQ(temperature_problem(-0.1, "--temperature"), "--temperature must be between 0 and 2 (0: greedy), got -0.1");
  EXPECT_NE(temperature_problem(std::nan(""), "'temperature'"), "");
  EXPECT_EQ(top_p_problem(1, "--top-p"), "");
  EXPECT_EQ(top_p_problem(0, "'top_p'"), "'top_p' must be greater than 0 and at most 1, got 0");
  EXPECT_NE(top_p_problem(1.5, "--top-p"), "");
  EXPECT_EQ(top_k_problem(-1, "--top-k"), "");
  EXPECT_EQ(top_k_problem(-2, "--top-k"), "--top-k must be a positive integer, or 0 or -1 for no limit, got -2");
  EXPECT_EQ(user_top_k(-1), 0);
  EXPECT_EQ(user_top_k(5), 5);
  EXPECT_EQ(max_tokens_problem(1, "--max-tokens"), "");
  EXPECT_EQ(max_tokens_problem(0, "--max-tokens"), "--max-tokens must be at least 1, got 0");
}

// The tensor-parallel broadcast's serializer carries every field: each is set away from its
// default, and the bindings name them all, so a new field fails to compile here until it is
// given a value below (and in write/read_sampling_params).
TEST(SamplingParams, SerializerRoundTripsEveryField) {
  SamplingParams p;
  auto& [temperature, top_k, top_p, max_tokens, stop_token_ids, stop, seed, speculate, token_probs] = p;
  temperature = 0.7;
  top_k = 5;
  top_p = 0.9;
  max_tokens = 33;
  stop_token_ids = {2, 7};
  stop = {"###", "", "end"};
  seed = 0xfeedfacecafebeefull;
  speculate = false;
  token_probs = true;
  EXPECT_NE(p, SamplingParams{});
  ByteWriter w;
  write_sampling_params(w, p);
  w.put(int32_t(42));  // what follows the params is read from the right place
  ByteReader r(w.bytes());
  EXPECT_EQ(read_sampling_params(r), p);
  EXPECT_EQ(r.get<int32_t>(), 42);
  EXPECT_TRUE(r.done());

  SamplingParams plain;  // the defaults, an unset seed among them
  ByteWriter w2;
  write_sampling_params(w2, plain);
  ByteReader r2(w2.bytes());
  EXPECT_EQ(read_sampling_params(r2), plain);
  EXPECT_THROW(r2.get<uint8_t>(), loom::Error);  // nothing past the end
}
