// Speculative decoding end to end on tiny models: greedy outputs equal plain decoding's for
// both proposers (a draft model, n-gram lookup) in batches under preemption, chunking and
// prefix caching, with speculation on for some requests and off for others, and every block
// (the target's and the draft's) back in its pool at the end; sampled outputs follow the
// target's distribution exactly (chi-square against the exact distribution of four tokens),
// and a rule that accepts every proposal fails the same check; the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "infer/infer_testing.h"
#include "loom/infer/engine.h"
#include "loom/infer/speculative.h"

using namespace loom;
using namespace loom::infer;
using fixtures::expect_all_blocks_free;
using fixtures::Job;
using fixtures::random_tokens;
using fixtures::run_together;
using model::Family;

namespace {

enum class Prop { draft, same_draft, ngram };
struct Case {
  Family family;
  Prop prop;
};
std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  const char* p = i.param.prop == Prop::draft ? "draft" : i.param.prop == Prop::same_draft ? "same_draft" : "ngram";
  return std::string(model::family_name(i.param.family)) + "_" + p;
}

SpeculativeConfig spec_config(Prop p, const model::Decoder* draft, int64_t k = 3) {
  SpeculativeConfig s;
  s.method = p == Prop::ngram ? SpecMethod::ngram : SpecMethod::draft;
  s.draft = p == Prop::ngram ? nullptr : draft;
  s.k = k;
  s.ngram_max = 3;
  s.max_batch = 0;  // speculate at every batch size, so the batched runs exercise it
  return s;
}

// Greedy jobs; prompts that repeat a phrase (n-gram lookup finds continuations), a shared
// system prefix, one request that does not speculate.
std::vector<Job> greedy_jobs() {
  std::vector<Job> jobs;
  const auto system = random_tokens(9, 100);
  for (int i = 0; i < 6; ++i) {
    Job j;
    const auto phrase = random_tokens(3 + i % 3, 300 + unsigned(i));
    for (int r = 0; r < 3; ++r) j.prompt.insert(j.prompt.end(), phrase.begin(), phrase.end());
    if (i % 2 == 0) j.prompt.insert(j.prompt.begin(), system.begin(), system.end());
    j.params = fixtures::greedy(14 + 3 * i);
    j.params.speculate = i != 3;
    j.arrive_step = i < 3 ? 0 : 2 * i;
    jobs.push_back(j);
  }
  return jobs;
}

class SpeculativeGreedy : public ::testing::TestWithParam<Case> {};

TEST_P(SpeculativeGreedy, SameTokensAsPlainDecodingUnderBatchingAndPreemption) {
  const Case c = GetParam();
  auto target = fixtures::wandering_model(c.family, DType::f64, 3, true);
  auto other = fixtures::wandering_model(c.family, DType::f64, 11, true);
  const model::Decoder* draft = c.prop == Prop::same_draft ? target.get() : other.get();
  const auto jobs = greedy_jobs();
  std::vector<std::vector<int32_t>> plain;
  {
    Engine solo(*target, fixtures::engine_config(256, 8, 256));
    for (const auto& j : jobs) plain.push_back(solo.generate(j.prompt, j.params));
  }
  for (bool tight : {false, true}) {
    EngineConfig ec = tight ? fixtures::engine_config(20, 4, 10) : fixtures::engine_config(256, 8, 256);
    ec.speculative = spec_config(c.prop, draft);
    Engine e(*target, ec);
    const auto got = run_together(e, jobs);
    for (size_t i = 0; i < jobs.size(); ++i)
      EXPECT_EQ(got.at(int(i)).tokens, plain[i]) << (tight ? "tight" : "roomy") << " job " << i;
    const EngineMetrics mt = e.metrics();
    EXPECT_GT(mt.spec_proposed, 0);
    EXPECT_GT(mt.spec_accepted, 0) << "nothing accepted: the comparison would only test rejection";
    if (c.prop == Prop::same_draft) {
      EXPECT_EQ(mt.spec_accepted, mt.spec_proposed) << "a draft equal to the target";
    }
    if (c.prop == Prop::draft) {
      EXPECT_LT(mt.spec_accepted, mt.spec_proposed) << "no rejection: rollback untested";
    }
    if (tight) {
      EXPECT_GT(mt.num_preemptions, 0) << "the tight budget was meant to force preemptions";
      EXPECT_GT(mt.prefix_hit_tokens, 0);
    }
    expect_all_blocks_free(e);
  }
}

INSTANTIATE_TEST_SUITE_P(Proposers, SpeculativeGreedy,
                         ::testing::Values(Case{Family::gpt2, Prop::draft}, Case{Family::llama, Prop::draft},
                                           Case{Family::gpt2, Prop::same_draft}, Case{Family::gpt2, Prop::ngram},
                                           Case{Family::llama, Prop::ngram}),
                         case_name);

// A model over four tokens whose next-token distributions are far from uniform and far from
// each other's; its draft is another such model.

std::unique_ptr<model::Decoder> four_token_model(uint64_t seed, double scale) {
  model::ModelConfig c = fixtures::tiny_config(Family::gpt2);
  c.vocab_size = 4;
  auto m = std::make_unique<model::Decoder>(c, model::DecoderOptions{}, DType::f64);
  m->init_weights(seed);
  for (const auto& p : m->layout().params())
    if (p.init == model::Init::normal)
      for (int64_t i = 0; i < p.numel(); ++i) m->params().data<double>()[p.offset + i] *= scale;
  return m;
}

// The exact probability of each 4-token output (as an index in base 4) under `params`.
std::vector<double> exact_distribution(model::Decoder& m, const std::vector<int32_t>& prompt,
                                       const SamplingParams& params) {
  std::vector<double> out(256, 1.0);
  std::vector<std::pair<double, int32_t>> scratch;
  std::vector<double> p;
  std::function<void(std::vector<int32_t>, int, double, int)> walk = [&](std::vector<int32_t> seq, int depth,
                                                                         double prob, int code) {
    if (depth == 4) {
      out[size_t(code)] = prob;
      return;
    }
    const int64_t T = int64_t(seq.size());
    Tensor logits = Tensor::zeros({1, T, 4}, DType::f64);
    m.logits(seq.data(), 1, T, logits);
    EXPECT_TRUE(sampling_distribution(logits.data<double>() + (T - 1) * 4, 4, params, p, scratch));
    const std::vector<double> here = p;
    for (int32_t t = 0; t < 4; ++t) {
      auto next = seq;
      next.push_back(t);
      walk(next, depth + 1, prob * here[size_t(t)], code * 4 + t);
    }
  };
  walk(prompt, 0, 1.0, 0);
  return out;
}

// Pearson's statistic of counts against the exact distribution (cells expecting fewer than 5
// pooled; a count in a cell of probability 0 is infinitely unlikely), and its degrees of
// freedom.
std::pair<double, int> chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double stat = 0, pooled_e = 0;
  int64_t pooled_o = 0;
  int cells = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * double(n);
    if (p[i] == 0) {
      if (counts[i] > 0) return {INFINITY, 1};
      continue;
    }
    if (e < 5) {
      pooled_e += e;
      pooled_o += counts[i];
      continue;
    }
    stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    stat += (double(pooled_o) - pooled_e) * (double(pooled_o) - pooled_e) / pooled_e;
    ++cells;
  }
  return {stat, cells - 1};
}

// The chi-square quantile at 1 - 1e-4 (Wilson-Hilferty).
double chi_square_limit(int dof) {
  const double z = 3.719, a = 2.0 / (9.0 * dof);
  return dof * std::pow(1 - a + z * std::sqrt(a), 3);
}

std::vector<int64_t> sample_counts(model::Decoder& target, const EngineConfig& ec, const std::vector<int32_t>& prompt,
                                   const SamplingParams& params, int64_t n) {
  Engine e(target, ec);
  std::vector<int64_t> counts(256, 0);
  for (int64_t i = 0; i < n; ++i) e.add_request(prompt, params);
  while (e.has_unfinished())
    for (const auto& o : e.step()) {
      EXPECT_EQ(o.tokens.size(), 4u);
      int code = 0;
      for (int32_t t : o.tokens) code = code * 4 + t;
      ++counts[size_t(code)];
    }
  expect_all_blocks_free(e);
  if (ec.speculative.enabled()) {
    const EngineMetrics mt = e.metrics();
    EXPECT_GT(mt.spec_verifications, n / 2) << "most requests were meant to verify proposals";
    EXPECT_GT(mt.spec_accepted, 0);
    if (ec.speculative.rule == AcceptRule::exact) {
      EXPECT_LT(mt.spec_accepted, mt.spec_proposed);
    }
  }
  return counts;
}

}  // namespace

TEST(SpeculativeSampling, OutputsFollowTheTargetsDistributionExactly) {
  auto target = four_token_model(21, 4.0);
  auto draft = four_token_model(22, 4.0);
  const std::vector<int32_t> prompt = {1, 3, 0, 2, 2};
  // Temperature 1 over the whole vocabulary; then temperature 0.9 within the top 3 tokens,
  // where one token per position has probability 0 and the residual must keep it there.
  for (int setting = 0; setting < 2; ++setting) {
    SamplingParams sp;
    sp.temperature = setting == 0 ? 1.0 : 0.9;
    sp.top_k = setting == 0 ? 0 : 3;
    sp.max_tokens = 4;
    const std::vector<double> p = exact_distribution(*target, prompt, sp);
    const std::vector<double> q = exact_distribution(*draft, prompt, sp);
    double tv = 0;
    for (size_t i = 0; i < p.size(); ++i) tv += 0.5 * std::abs(p[i] - q[i]);
    ASSERT_GT(tv, 0.2) << "the draft is too close to the target for the mutation to show";
    const int64_t n = 6000;
    EngineConfig base = fixtures::engine_config(4096, 64, 512);
    base.seed = 7;
    struct Run {
      const char* name;
      SpecMethod method;
      AcceptRule rule;
    };
    for (const Run& run :
         {Run{"plain", SpecMethod::none, AcceptRule::exact}, Run{"draft", SpecMethod::draft, AcceptRule::exact},
          Run{"ngram", SpecMethod::ngram, AcceptRule::exact},
          Run{"draft accepting every proposal", SpecMethod::draft, AcceptRule::accept_all},
          Run{"ngram accepting every proposal", SpecMethod::ngram, AcceptRule::accept_all}}) {
      EngineConfig ec = base;
      if (run.method != SpecMethod::none) {
        ec.speculative = spec_config(run.method == SpecMethod::draft ? Prop::draft : Prop::ngram, draft.get(), 3);
        ec.speculative.ngram_max = 2;
        ec.speculative.adaptive = false;
        ec.speculative.rule = run.rule;
      }
      const auto counts = sample_counts(*target, ec, prompt, sp, n);
      const auto [stat, dof] = chi_square(counts, p, n);
      const double limit = chi_square_limit(dof);
      if (run.rule == AcceptRule::exact)
        EXPECT_LT(stat, limit) << run.name << ", setting " << setting << ": chi-square " << stat << " with " << dof
                               << " degrees of freedom";
      else
        EXPECT_GT(stat, limit) << run.name << ", setting " << setting << " passed the check it was meant to fail";
    }
  }
}

TEST(SpeculativeConfig, BadSettingsAreRefusedNamingTheFix) {
  auto target = fixtures::wandering_model(Family::gpt2, DType::f64, 3, true);
  auto expect_refused = [&](const EngineConfig& ec, const char* what) {
    try {
      Engine e(*target, ec);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::exception& ex) {
      EXPECT_NE(std::string(ex.what()).find(what), std::string::npos) << ex.what();
    }
  };
  EngineConfig ec = fixtures::engine_config(64, 4, 64);
  ec.speculative.method = SpecMethod::ngram;
  ec.speculative.k = 0;
  expect_refused(ec, "k=0 must be at least 1");
  ec.speculative.k = 4;
  ec.speculative.ngram_max = 0;
  expect_refused(ec, "n-gram sizes");
  ec.speculative.method = SpecMethod::draft;
  expect_refused(ec, "needs a draft model");
  model::ModelConfig other = fixtures::tiny_config(Family::gpt2);
  other.vocab_size = 50;
  model::Decoder small(other, model::DecoderOptions{}, DType::f64);
  ec.speculative.draft = &small;
  expect_refused(ec, "the draft's vocabulary has 50 tokens but the target's has 61");
}

TEST(NgramProposer, ProposesTheContinuationOfTheMostRecentLongestMatch) {
  NgramProposer p(3, 1);
  const std::vector<int32_t> t = {5, 6, 7, 1, 2, 9, 9, 6, 7, 4, 8, 3, 6, 7};
  ProposalRequest r;
  r.tokens = t;
  r.k = 4;
  p.propose(std::span<ProposalRequest>(&r, 1));
  EXPECT_EQ(r.proposals, (std::vector<int32_t>{4, 8, 3, 6}));  // "3 6 7" never recurs; "6 7" at 7 does
  const std::vector<int32_t> loop = {1, 2, 3, 9, 3, 9};        // "3 9" recurs at 2: 3 9 proposed again and again
  r.tokens = loop;
  p.propose(std::span<ProposalRequest>(&r, 1));
  EXPECT_EQ(r.proposals, (std::vector<int32_t>{3, 9, 3, 9}));
  const std::vector<int32_t> none = {1, 2, 3};
  r.tokens = none;
  p.propose(std::span<ProposalRequest>(&r, 1));
  EXPECT_TRUE(r.proposals.empty());
}
