// The engine end to end on tiny random models: greedy output equals dense no-cache decoding
// with Decoder::logits; requests batched together (preempted by a tiny KV budget, chunked,
// sharing prefixes, arriving at different steps) produce exactly the tokens each produces
// alone; every block returns to the pool. Equality runs in f64: in f32 the BLAS kernels round
// a row differently with the batch's row count, which would test OpenBLAS, not scheduling.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "loom/infer/engine.h"

using namespace loom;
using namespace loom::infer;
using model::Family;

namespace {

model::ModelConfig tiny(Family f) {
  model::ModelConfig c = model::preset(f == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = f == Family::gpt2 ? 4 : 2;
  c.d_ff = f == Family::gpt2 ? 64 : 48;
  c.vocab_size = 61;
  c.n_ctx = 64;
  return c;
}

// Weights ten times the usual init scale, so greedy outputs wander over the vocabulary.
std::unique_ptr<model::Decoder> make_model(Family f, DType dt, uint64_t seed = 3) {
  auto m = std::make_unique<model::Decoder>(tiny(f), model::DecoderOptions{}, dt);
  m->init_weights(seed);
  std::mt19937 g{unsigned(seed)};
  std::normal_distribution<double> nd(0.0, 0.1);
  for (const auto& p : m->layout().params())
    for (int64_t i = 0; i < p.numel(); ++i) {
      const int64_t k = p.offset + i;
      if (dt == DType::f64) {
        double& v = m->params().data<double>()[k];
        v = p.init == model::Init::normal ? v * 10 : v + nd(g);
      } else {
        float& v = m->params().data<float>()[k];
        v = p.init == model::Init::normal ? v * 10 : v + float(nd(g));
      }
    }
  return m;
}

std::vector<int32_t> random_tokens(int n, unsigned seed, int V = 61) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % unsigned(V));
  return t;
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
      last[size_t(v)] = m.params().dtype() == DType::f64
                            ? logits.data<double>()[(T - 1) * V + v]
                            : double(row[size_t((T - 1) * V + v)]);
    const int32_t best = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    out.push_back(best);
    seq.push_back(best);
  }
  return out;
}

EngineConfig roomy() {
  EngineConfig c;
  c.block_size = 4;
  c.num_blocks = 256;
  c.max_num_seqs = 8;
  c.max_batched_tokens = 256;
  return c;
}

void expect_all_blocks_free(const Engine& e) {
  const auto& pool = e.scheduler().kv().pool();
  EXPECT_EQ(pool.num_free(), pool.num_blocks());
  EXPECT_EQ(e.scheduler().kv().num_sequences(), 0);
  EXPECT_FALSE(e.has_unfinished());
}

}  // namespace

class EngineVsDense : public ::testing::TestWithParam<Family> {};

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

INSTANTIATE_TEST_SUITE_P(Families, EngineVsDense, ::testing::Values(Family::gpt2, Family::llama));

// f32: the runner's logits (prefill, then decode steps through the cache) against dense ones.
TEST(ModelRunner, F32LogitsMatchDenseThroughPrefillAndDecode) {
  for (Family f : {Family::gpt2, Family::llama}) {
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

namespace {

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int arrive_step;
};

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

// Runs the jobs on one engine, adding each at its arrival step; returns outputs by job index.
std::map<int, RequestOutput> run_together(Engine& e, const std::vector<Job>& jobs) {
  std::map<int64_t, int> job_of;
  std::map<int, RequestOutput> out;
  for (int step = 0; out.size() < jobs.size(); ++step) {
    if (step > 10000) {
      ADD_FAILURE() << "no progress";
      break;
    }
    for (size_t i = 0; i < jobs.size(); ++i)
      if (jobs[i].arrive_step == step) job_of[e.add_request(jobs[i].prompt, jobs[i].params)] = int(i);
    for (auto& o : e.step()) out[job_of.at(o.id)] = std::move(o);
  }
  return out;
}

}  // namespace

class BatchEqualsAlone : public ::testing::TestWithParam<Family> {};

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
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(batched.at(int(i)).tokens, alone[i]);
  expect_all_blocks_free(st);
}

INSTANTIATE_TEST_SUITE_P(Families, BatchEqualsAlone, ::testing::Values(Family::gpt2, Family::llama));
