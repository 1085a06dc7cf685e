// Shared fixtures of the infer tests: a two-layer model small enough for f64, whose weights
// make greedy decoding wander over the vocabulary, and random prompts.
#pragma once
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "loom/infer/engine.h"
#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "loom/infer/quant_weights.h"
#include "loom/model/decoder.h"

namespace loom::infer::fixtures {

inline model::ModelConfig tiny_config(model::Family f) {
  const bool gpt2 = f == model::Family::gpt2;
  model::ModelConfig c = model::preset(gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = gpt2 ? 4 : 2;
  c.d_ff = gpt2 ? 64 : 48;
  c.vocab_size = 61;
  c.n_ctx = 64;
  return c;
}

// Normal-initialised weights ten times the usual scale, so greedy outputs wander over the
// vocabulary; with perturb_others, the constant-initialised ones (norm gains, biases) also
// get N(0, 0.1) noise.
// tiny_config with MoE blocks: 4 experts top-2, a shared expert, dense block 0 (moe_every 2).
inline model::ModelConfig tiny_moe_config(model::Family f) {
  model::ModelConfig c = tiny_config(f);
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.expert_d_ff = 16;
  c.moe.num_shared_experts = 1;
  c.moe.moe_every = 2;
  return c;
}

inline std::unique_ptr<model::Decoder> wandering_model(model::Family f, DType dt, uint64_t seed, bool perturb_others,
                                                       bool moe = false) {
  auto m = std::make_unique<model::Decoder>(moe ? tiny_moe_config(f) : tiny_config(f), model::DecoderOptions{}, dt);
  m->init_weights(seed);
  std::mt19937 g{unsigned(seed)};
  std::normal_distribution<double> nd(0.0, 0.1);
  for (const auto& p : m->layout().params()) {
    const bool scale = p.init == model::Init::normal;
    if (!scale && !perturb_others) continue;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const int64_t k = p.offset + i;
      if (dt == DType::f64) {
        double& v = m->params().data<double>()[k];
        v = scale ? v * 10 : v + nd(g);
      } else {
        float& v = m->params().data<float>()[k];
        v = scale ? v * 10 : v + float(nd(g));
      }
    }
  }
  return m;
}

inline std::vector<int32_t> random_tokens(int n, unsigned seed, int V = 61) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % unsigned(V));
  return t;
}

// An engine with 4-token blocks (small enough that prompts span several).
inline EngineConfig engine_config(int64_t num_blocks, int64_t max_num_seqs, int64_t max_batched_tokens) {
  EngineConfig c;
  c.block_size = 4;
  c.num_blocks = num_blocks;
  c.max_num_seqs = max_num_seqs;
  c.max_batched_tokens = max_batched_tokens;
  return c;
}

inline SamplingParams greedy(int64_t n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  return p;
}

// A request of a test workload, added to the engine at step arrive_step.
struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int arrive_step = 0;
};

// Runs the jobs on one engine, adding each at its arrival step; returns outputs by job index.
inline std::map<int, RequestOutput> run_together(Engine& e, const std::vector<Job>& jobs) {
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

// Every KV block (and the draft's, with speculation) back in its pool, nothing in flight.
inline void expect_all_blocks_free(const Engine& e) {
  const auto& pool = e.scheduler().kv().pool();
  EXPECT_EQ(pool.num_free(), pool.num_blocks());
  EXPECT_EQ(e.scheduler().kv().num_sequences(), 0);
  EXPECT_EQ(e.metrics().draft_kv_blocks_used, 0);
  EXPECT_FALSE(e.has_unfinished());
}

// Logits of the last token of `prompt` through a runner over `model` (and `quant`).
inline std::vector<float> last_logits(const model::Decoder& model, const QuantizedModel* quant,
                                      const std::vector<int32_t>& prompt) {
  const int64_t T = int64_t(prompt.size()), bs = 4, nb = KVCache::blocks_for_tokens(T, bs);
  KVCache cache(model.config(), nb, bs, DType::f32);
  ModelRunner runner(model, cache, T, 1, quant);
  std::vector<int32_t> table(static_cast<size_t>(nb));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  StepPlan plan;
  ScheduledSeq s;
  s.seq_id = 0;
  s.num_tokens = T;
  s.sample = true;
  s.tokens = prompt;
  s.block_table = table;
  plan.seqs.push_back(s);
  const Tensor logits = runner.execute(plan);
  return std::vector<float>(logits.data<float>(), logits.data<float>() + model.config().vocab_size);
}

}  // namespace loom::infer::fixtures
