// The engine end to end on tiny random models (dense, and with MoE blocks, whose tokens are
// grouped by expert per step): greedy output equals dense no-cache decoding
// with Decoder::logits; requests batched together (preempted by a tiny KV budget, chunked,
// sharing prefixes, arriving at different steps) produce exactly the tokens each produces
// alone, also in static batching (a batch admitted whole, each member returned as it
// finishes, nobody admitted until the batch has left); every block returns to the pool. Equality runs in f64: in f32
// the BLAS kernels round a row differently with the batch's row count, which would test OpenBLAS, not scheduling.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <set>

#include "infer/infer_testing.h"
#include "loom/infer/engine.h"

using namespace loom;
using namespace loom::infer;
using fixtures::expect_all_blocks_free;
using fixtures::Job;
using fixtures::random_tokens;
using fixtures::run_together;
using model::Family;

namespace {

// The test models: each family dense, and with MoE blocks (tiny_moe_config).
struct Variant {
  Family family;
  bool moe;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << model::family_name(v.family) << (v.moe ? "_moe" : ""); }
const auto kVariants = ::testing::Values(Variant{Family::gpt2, false}, Variant{Family::llama, false},
                                         Variant{Family::gpt2, true}, Variant{Family::llama, true});
std::string variant_name(const ::testing::TestParamInfo<Variant>& i) {
  return std::string(model::family_name(i.param.family)) + (i.param.moe ? "_moe" : "");
}

std::unique_ptr<model::Decoder> make_model(Family f, DType dt, uint64_t seed = 3) {
  return fixtures::wandering_model(f, dt, seed, /*perturb_others=*/true);
}
// MoE models from seed 4: the GPT-2 MoE model's greedy outputs from seeds 5-7 settle on one or
// three tokens, too few to prove anything.
std::unique_ptr<model::Decoder> make_model(Variant v, DType dt, uint64_t seed = 3) {
  return fixtures::wandering_model(v.family, dt, v.moe ? 4 : seed, /*perturb_others=*/true, v.moe);
}

// Dense, cache-free greedy decoding: the whole growing sequence through Decoder::logits.
std::vector<int32_t> dense_greedy(model::Decoder& m, std::vector<int32_t> seq, int n) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> out;
  for (int k = 0; k < n; ++k) {
    const int64_t T = int64_t(seq.size());
    Tensor logits = Tensor::zeros({1, T, V}, m.params().dtype());
    m.logits(seq.data(), 1, T, logits);
    const std::vector<float> row = logits.to_f32_vector();
    std::vector<double> last(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v)
      last[size_t(v)] = m.params().dtype() == DType::f64 ? logits.data<double>()[(T - 1) * V + v]
                                                         : double(row[size_t((T - 1) * V + v)]);
    const int32_t best = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(best);
    seq.push_back(best);
  }
  return out;
}

EngineConfig roomy() { return fixtures::engine_config(256, 8, 256); }

}  // namespace

class EngineVsDense : public ::testing::TestWithParam<Variant> {};

TEST_P(EngineVsDense, GreedyEqualsDenseDecoding) {
  auto m = make_model(GetParam(), DType::f64);
  Engine e(*m, roomy());
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 30;
  for (unsigned s = 0; s < 3; ++s) {
    const auto prompt = random_tokens(5 + int(s) * 7, s);
    const auto got = e.generate(prompt, sp);
    EXPECT_EQ(got, dense_greedy(*m, prompt, 30)) << "prompt " << s;
    const std::set<int32_t> distinct(got.begin(), got.end());
    EXPECT_GT(distinct.size(), 3u) << "a degenerate output would prove little";
  }
  expect_all_blocks_free(e);
}

INSTANTIATE_TEST_SUITE_P(Families, EngineVsDense, kVariants, variant_name);

// f32: the runner's logits (prefill, then decode steps through the cache) against dense ones.
TEST(ModelRunner, F32LogitsMatchDenseThroughPrefillAndDecode) {
  for (Variant f : {Variant{Family::gpt2, false}, Variant{Family::llama, false}, Variant{Family::llama, true}}) {
    auto m = make_model(f, DType::f32);
    const int64_t V = m->config().vocab_size;
    SchedulerConfig sc;
    sc.num_blocks = 32;
    sc.block_size = 4;
    sc.max_batched_tokens = 8;  // the 11-token prompt is prefilled in two chunks
    Scheduler sched(sc);
    KVCache cache(m->config(), 32, 4, DType::f32);
    ModelRunner runner(*m, cache, 8, 4);
    auto seq = random_tokens(11, 9);
    sched.add(0, seq);
    for (int step = 0; step < 8; ++step) {
      StepPlan plan = sched.schedule();
      Tensor logits = runner.execute(plan);
      sched.complete(plan);
      if (plan.num_sampled() == 0) continue;
      const int64_t T = int64_t(seq.size());
      Tensor dense = Tensor::zeros({1, T, V}, DType::f32);
      m->logits(seq.data(), 1, T, dense);
      const float* want = dense.data<float>() + (T - 1) * V;
      const float* got = logits.data<float>();
      for (int64_t v = 0; v < V; ++v) ASSERT_NEAR(got[v], want[v], 2e-4) << "step " << step;
      const int32_t next = int32_t(std::max_element(got, got + V) - got);
      seq.push_back(next);
      sched.append_token(0, next);
    }
    EXPECT_EQ(int64_t(seq.size()), 11 + 7);
  }
}

// The runner's per-expert token counts (what `loom eval` reports) are the router's choices:
// those of the training forward on the same tokens, top_k per token.
TEST(ModelRunner, MoeExpertLoadCountsTheRoutersChoices) {
  auto m = make_model(Variant{Family::llama, true}, DType::f32);
  const model::ModelConfig& cfg = m->config();
  const int64_t T = 12;
  const auto tok = random_tokens(int(T), 21);
  std::vector<int32_t> tgt(tok.begin() + 1, tok.end());
  tgt.push_back(0);
  KVCache cache(cfg, 8, 4, DType::f32);
  ModelRunner runner(*m, cache, T, 1);
  const std::vector<int32_t> table = {0, 1, 2};
  StepPlan plan;
  ScheduledSeq s;
  s.num_tokens = T;
  s.tokens = tok;
  s.block_table = table;
  plan.seqs.push_back(s);
  runner.execute_all_rows(plan);
  m->reset_moe_stats();
  m->forward_backward(tok.data(), tgt.data(), 1, T, 1.0);
  ASSERT_EQ(int64_t(runner.expert_load().size()), cfg.num_moe_layers());
  ASSERT_GT(cfg.num_moe_layers(), 0);
  for (size_t i = 0; i < runner.expert_load().size(); ++i) {
    const std::vector<int64_t>& load = runner.expert_load()[i];
    EXPECT_EQ(load, m->moe_stats()[i].load) << "MoE block " << i;
    EXPECT_EQ(std::accumulate(load.begin(), load.end(), int64_t(0)), T * cfg.moe.top_k);
  }
  runner.execute_all_rows(plan);  // counts add up until reset
  EXPECT_EQ(std::accumulate(runner.expert_load()[0].begin(), runner.expert_load()[0].end(), int64_t(0)),
            2 * T * cfg.moe.top_k);
  runner.reset_expert_load();
  for (const auto& load : runner.expert_load()) EXPECT_EQ(std::accumulate(load.begin(), load.end(), int64_t(0)), 0);
}

namespace {

std::vector<Job> mixed_jobs() {
  std::vector<Job> jobs;
  const auto system = random_tokens(13, 100);  // a shared prefix of three full blocks and a bit
  for (int i = 0; i < 7; ++i) {
    Job j;
    j.prompt = random_tokens(3 + 5 * i % 17, 200 + unsigned(i));
    if (i % 2 == 0) j.prompt.insert(j.prompt.begin(), system.begin(), system.end());
    if (i == 5) j.prompt = jobs[0].prompt;  // an identical prompt: a whole-prompt cache hit
    j.params.max_tokens = 12 + 3 * i;
    if (i % 3 == 0) {
      j.params.temperature = 0;
    } else {
      j.params.temperature = 0.9;
      j.params.top_k = i % 3 == 1 ? 20 : 0;
      j.params.top_p = 0.85;
      j.params.seed = 1000 + uint64_t(i);
    }
    j.arrive_step = i < 4 ? 0 : i == 5 ? 2 : 2 * i;  // 5 arrives once 0's prompt is cached
    jobs.push_back(j);
  }
  return jobs;
}

}  // namespace

class BatchEqualsAlone : public ::testing::TestWithParam<Variant> {};

TEST_P(BatchEqualsAlone, UnderPreemptionChunkingAndSharedPrefixes) {
  auto m = make_model(GetParam(), DType::f64);
  const auto jobs = mixed_jobs();
  std::vector<std::vector<int32_t>> alone;
  for (const auto& j : jobs) {
    Engine solo(*m, roomy());
    alone.push_back(solo.generate(j.prompt, j.params));
    EXPECT_EQ(int64_t(alone.back().size()), j.params.max_tokens);
  }
  EngineConfig tight = roomy();
  tight.num_blocks = 18;          // 72 slots for up to 7 sequences of up to 47 tokens
  tight.max_batched_tokens = 10;  // prompts are prefilled in chunks
  tight.max_num_seqs = 5;
  Engine e(*m, tight);
  const auto together = run_together(e, jobs);
  ASSERT_EQ(together.size(), jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(together.at(int(i)).tokens, alone[i]) << "job " << i;
    EXPECT_EQ(together.at(int(i)).finish_reason, FinishReason::length);
  }
  const EngineMetrics mt = e.metrics();
  EXPECT_GT(mt.num_preemptions, 0) << "the budget was meant to force preemptions";
  EXPECT_GT(mt.prefix_hit_tokens, 0) << "the shared prefixes were meant to hit the cache";
  EXPECT_EQ(mt.kv_blocks_used, 0);
  expect_all_blocks_free(e);
  // Static batching computes the same tokens, only in a different order.
  tight.mode = BatchingMode::static_batch;
  Engine st(*m, tight);
  const auto batched = run_together(st, jobs);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(batched.at(int(i)).tokens, alone[i]) << "static job " << i;
  expect_all_blocks_free(st);
}

INSTANTIATE_TEST_SUITE_P(Families, BatchEqualsAlone, kVariants, variant_name);

namespace {

EngineConfig static_batching(EngineConfig c) {
  c.mode = BatchingMode::static_batch;
  return c;
}

struct StepOutput {
  RequestOutput out;
  int step = -1;
};

// Runs jobs that all arrive at step 0; records each output with the step it came on.
std::vector<StepOutput> run_all(Engine& e, const std::vector<Job>& jobs,
                                std::map<int64_t, std::vector<TokenEvent>>* events = nullptr) {
  std::map<int64_t, size_t> job_of;
  std::vector<StepOutput> out(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i)
    job_of[e.add_request(jobs[i].prompt, jobs[i].params, [events](const TokenEvent& ev) {
      if (events) (*events)[ev.request_id].push_back(ev);
    })] = i;
  for (int step = 0; e.has_unfinished() && step < 10000; ++step)
    for (auto& o : e.step()) out[job_of.at(o.id)] = {std::move(o), step};
  return out;
}

}  // namespace

class StaticBatching : public ::testing::TestWithParam<Family> {};

// Batches of three, {0, 1, 2} then {3, 4}: each member returns as it finishes (job 2 on a stop
// token), nobody of the second batch starts before the first has left, the outputs are each
// job's alone, and no row is computed past a member's end.
TEST_P(StaticBatching, MembersLeaveAsTheyFinishAndTheNextBatchWaits) {
  auto m = make_model(GetParam(), DType::f64);
  std::vector<Job> jobs;
  const int64_t lens[] = {4, 15, 12, 20, 6};
  for (int i = 0; i < 5; ++i) {
    Job j;
    j.prompt = random_tokens(3 + 4 * i, 300 + unsigned(i));
    j.params.max_tokens = lens[i];
    j.params.temperature = i % 2 ? 0.9 : 0;
    j.params.seed = 77 + uint64_t(i);
    j.arrive_step = 0;
    jobs.push_back(j);
  }
  jobs[2].params.stop_token_ids = {Engine(*m, roomy()).generate(jobs[2].prompt, jobs[2].params)[6]};
  std::vector<RequestOutput> alone;
  for (const auto& j : jobs) alone.push_back(Engine(*m, roomy()).run(j.prompt, j.params));
  ASSERT_EQ(alone[2].finish_reason, FinishReason::stop);

  EngineConfig cfg = static_batching(roomy());
  cfg.max_num_seqs = 3;
  Engine e(*m, cfg);
  const auto got = run_all(e, jobs);
  // A member samples one token per step of its batch (the stop token too) and returns on the
  // step of its last; the second batch is admitted on the step after the first one's last
  // member left.
  int64_t decode = 0, batch_start = 0;
  for (const std::vector<size_t>& batch : {std::vector<size_t>{0, 1, 2}, {3, 4}}) {
    int64_t longest = 0;
    for (size_t i : batch) {
      EXPECT_EQ(got[i].out.tokens, alone[i].tokens) << "job " << i;
      EXPECT_EQ(got[i].out.finish_reason, alone[i].finish_reason) << "job " << i;
      const int64_t rows = int64_t(alone[i].tokens.size()) + (alone[i].stop_token >= 0 ? 1 : 0);
      EXPECT_EQ(got[i].step, batch_start + rows - 1) << "job " << i << " returns as it finishes";
      longest = std::max(longest, rows);
      decode += rows - 1;  // the first token comes from the prefill
    }
    batch_start += longest;
  }
  EXPECT_EQ(e.metrics().decode_rows, decode);
  expect_all_blocks_free(e);
}

INSTANTIATE_TEST_SUITE_P(Families, StaticBatching, ::testing::Values(Family::gpt2, Family::llama));

// TokenEvent::prob, asked for by SamplingParams::token_probs: each streamed token's softmax
// probability at temperature 1, as dense decoding of the same sequence computes it, for
// greedy and for sampled tokens; NaN when not asked for.
TEST(EngineTokenProbs, EqualTheDenseSoftmaxOfEachToken) {
  auto m = make_model(Family::gpt2, DType::f64);
  const int64_t V = m->config().vocab_size;
  for (double temperature : {0.0, 0.8}) {
    Engine engine(*m, roomy());
    const std::vector<int32_t> prompt = random_tokens(7, 11, int(V));
    SamplingParams p;
    p.temperature = temperature;
    p.max_tokens = 6;
    p.seed = 5;
    p.token_probs = true;
    std::vector<std::pair<int32_t, double>> got;
    engine.add_request(prompt, p, [&](const TokenEvent& ev) {
      if (ev.token >= 0) got.push_back({ev.token, ev.prob});
    });
    SamplingParams plain = p;
    plain.token_probs = false;
    double plain_prob = 0;
    engine.add_request(prompt, plain, [&](const TokenEvent& ev) {
      if (ev.token >= 0) plain_prob = ev.prob;
    });
    while (engine.has_unfinished()) engine.step();
    ASSERT_EQ(got.size(), 6u);
    EXPECT_TRUE(std::isnan(plain_prob));
    std::vector<int32_t> seq = prompt;
    for (const auto& [tok, prob] : got) {
      const int64_t T = int64_t(seq.size());
      Tensor logits = Tensor::zeros({1, T, V}, DType::f64);
      m->logits(seq.data(), 1, T, logits);
      const double* row = logits.data<double>() + (T - 1) * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v]);
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
      EXPECT_NEAR(prob, std::exp(row[tok] - mx) / sum, 1e-12) << "temperature " << temperature;
      seq.push_back(tok);
    }
  }
}
