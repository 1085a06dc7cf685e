// Tensor-parallel inference under mpiexec: every rank holds slice r of tp = world size of a
// tiny model and runs an Engine; rank 0 leads (its requests, callbacks and outputs), the
// others follow. Greedy and sampled outputs of a batched workload (chunked prefill, shared
// prefixes, preemption by a tight KV budget, n-gram speculation for some requests) equal a
// single-process engine's on the whole model, in f64 (the all-reduces sum partial products
// in another order, so f32 would compare rounding, not the split). Every rank's KV blocks
// are back in its pool at the end. A tp that does not divide the heads is refused.
#include <gtest/gtest.h>

#include <map>

#include "comm/mpi/mpi_world.h"
#include "infer/infer_testing.h"
#include "loom/infer/engine.h"
#include "loom/parallel/model_gather.h"

using namespace loom;
using namespace loom::infer;
using fixtures::Job;
using fixtures::random_tokens;
using model::Family;

namespace {

std::vector<Job> jobs() {
  std::vector<Job> out;
  const auto system = random_tokens(9, 100);
  for (int i = 0; i < 6; ++i) {
    Job j;
    const auto phrase = random_tokens(3 + i % 3, 50 + unsigned(i));  // repeated: n-gram lookup finds it
    for (int r = 0; r < 3; ++r) j.prompt.insert(j.prompt.end(), phrase.begin(), phrase.end());
    if (i % 2 == 0) j.prompt.insert(j.prompt.begin(), system.begin(), system.end());
    j.params.max_tokens = 16 + 3 * i;
    if (i % 3 == 0) {
      j.params.temperature = 0;
    } else {
      j.params.temperature = 0.8;
      j.params.top_k = i % 3 == 1 ? 12 : 0;
      j.params.seed = 500 + uint64_t(i);
    }
    j.params.speculate = i != 2;
    j.arrive_step = i < 3 ? 0 : 3 * i;
    out.push_back(j);
  }
  return out;
}

EngineConfig tight() {
  EngineConfig c = fixtures::engine_config(16, 4, 12);
  c.speculative.method = SpecMethod::ngram;
  c.speculative.k = 3;
  c.speculative.max_batch = 0;
  return c;
}

// Rank 0: runs the jobs, adding each at its step; the others follow.
std::map<int, RequestOutput> run(Engine& e, const std::vector<Job>& js) {
  if (!e.leader()) {
    e.follow();
    return {};
  }
  auto out = fixtures::run_together(e, js);
  e.close();
  return out;
}

}  // namespace

TEST(ModelParallelInference, TensorParallelEnginesEqualOneProcess) {
  const comm::Group& world = test_world();
  const int N = world.size();
  for (Family f : {Family::gpt2, Family::llama}) {
    SCOPED_TRACE(model::family_name(f));
    auto whole = fixtures::wandering_model(f, DType::f64, 3, true);
    const model::ModelConfig& mc = whole->config();
    model::DecoderOptions opt;
    opt.slice.tp = N;
    opt.slice.tp_rank = world.rank();
    opt.allocate_flat_grads = false;  // inference
    if (mc.n_head % N != 0 || mc.n_kv_head % N != 0) {
      // Refused, naming the setting and what divides.
      try {
        model::Decoder local(mc, opt, DType::f64);
        EngineConfig ec = tight();
        ec.tp = &world;
        Engine e(local, ec);
        ADD_FAILURE() << "tp=" << N << " was accepted for " << mc.n_head << " heads, " << mc.n_kv_head << " kv heads";
      } catch (const std::exception& ex) {
        const std::string what = ex.what();
        EXPECT_TRUE(what.find(str_cat("tp=", N, " does not divide model.n_head")) != std::string::npos ||
                    what.find(str_cat("size ", N, " does not divide model.n_kv_head")) != std::string::npos)
            << what;
      }
      continue;
    }
    model::Decoder local(mc, opt, DType::f64);
    parallel::slice_whole_params(whole->layout(), whole->params(), local.layout(), local.params());
    const auto js = jobs();
    EngineConfig ec = tight();
    ec.tp = &world;
    Engine e(local, ec);
    const auto got = run(e, js);
    const auto& pool = e.scheduler().kv().pool();
    EXPECT_EQ(pool.num_free(), pool.num_blocks()) << "rank " << world.rank();
    EXPECT_FALSE(e.has_unfinished()) << "rank " << world.rank();
    if (world.rank() != 0) continue;
    EXPECT_GT(e.metrics().num_preemptions, 0) << "the tight KV budget was meant to force preemptions";
    EXPECT_GT(e.metrics().spec_accepted, 0)
        << e.metrics().spec_proposed << " proposed, " << e.metrics().spec_verifications << " verifications";
    Engine one(*whole, tight());
    const auto want = run(one, js);
    ASSERT_EQ(got.size(), js.size());
    for (size_t i = 0; i < js.size(); ++i) EXPECT_EQ(got.at(int(i)).tokens, want.at(int(i)).tokens) << "job " << i;
  }
}
