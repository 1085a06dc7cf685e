// Invariant 1 for tensor and pipeline parallelism: under mpiexec, every layout pp x dp x tp whose
// product is the world size (GPipe, 1F1B, interleaved 1F1B, ZB-H1 and ZB-V, ZeRO-0/1, with and without
// activation checkpointing, GPT-2 with tied embeddings and LLaMA with GQA, rows packing several
// documents) gives the per-step losses and final weights of a single-process run of the same
// global batch (ZeRO-2/3 too where there is no pipeline); a tied token table stays identical on
// the first and last stages, and tp-replicated parameters on every tp rank. The tolerance policy
// is dp_equivalence_test.cpp's (reductions and micro-batch sums happen in another order, so
// results agree to float rounding, not bitwise): losses |a - b| <= 1e-5 |b|; weights after 20
// AdamW steps within 1e-5 |b| + 1e-3 lr except for at most 0.05% of elements (Adam divides by the
// running gradient size, so an element whose gradient is nearly zero turns rounding noise into a
// step of up to lr), none beyond 1% of lr * steps; GPT-2's key bias (no gradient in exact
// arithmetic) is skipped. Layouts marked bf16 (model.precision=bf16) are compared with a bf16
// single-process run under the bf16 tolerances of dp_equivalence_test.cpp. A 3D run saved and
// resumed on the same layout continues bitwise like the run that never stopped.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "comm/mpi/mpi_world.h"
#include "loom/core/timer.h"
#include "loom/model/hf_weights.h"
#include "loom/model/memory_estimate.h"
#include "loom/parallel/mesh.h"
#include "loom/train/checkpoint.h"
#include "loom/train/trainer.h"
#include "parallel/mpi/synthetic_source.h"
#include "parallel/mpi/weights_close.h"
#include "testing/errors.h"
#include "train/train_testing.h"

using namespace loom;
using namespace loom::train;
using loom::testing::SyntheticSource;

namespace {

struct Layout {
  const char* preset;
  int pp, dp, tp;
  const char* schedule;
  int zero, micro_batches, ckpt;
  const char* partition = "uniform";
  const char* precision = "fp32";
  int ep = 1;
  const char* extra = "";  // more config overrides, separated by spaces
  // ZeRO-1/2 keep the weights as the 16-bit replica and the owned fp32 masters
  // (parallel.weight_replica=on; the one-process reference has no replica).
  bool replica = false;
  bool packed = false;  // rows pack documents (SyntheticSource's positions)
};

std::string describe(const Layout& l) {
  return str_cat(l.preset, " pp=", l.pp, " dp=", l.dp, " ep=", l.ep, " tp=", l.tp, " ", l.schedule, " zero=", l.zero,
                 " m=", l.micro_batches, " ckpt=", l.ckpt, " ", l.partition, " ", l.precision, " ", l.extra,
                 l.replica ? " replica" : "", l.packed ? " packed" : "");
}

// MoE layouts: llama-moe-tiny (4 experts, top-2, dropless), and with a shared expert, GPT-2
// experts with sigmoid scores in every second block.
constexpr const char* kSharedExpert = "model.moe.num_shared_experts=1 model.moe.router_z_loss_coef=0.001";
constexpr const char* kGpt2Moe =
    "model.moe.num_experts=4 model.moe.expert_d_ff=32 model.moe.moe_every=2 model.moe.score=sigmoid";
// Interleaved 1F1B: two chunks per stage of one block each (pp=2: 4 blocks, pp=4: 8).
constexpr const char* kInterleaved2 = "model.n_layer=4 parallel.virtual_stages=2";
constexpr const char* kInterleaved4 = "model.n_layer=8 parallel.virtual_stages=2";
// ZB-V: two chunks per stage of one block each, placed as a V (stage 0 holds blocks 0 and 3).
constexpr const char* kVee2 = "model.n_layer=4";
constexpr const char* kVee4 = "model.n_layer=8";

// The layouts run for each world size (one ctest entry per size keeps every run short).
const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      // 2 ranks: tp=2; pp=2 with both schedules.
      {"gpt2-tiny", 1, 1, 2, "1f1b", 0, 2, 0},
      {"llama-tiny", 1, 1, 2, "1f1b", 0, 2, 1},
      {"gpt2-tiny", 2, 1, 1, "gpipe", 0, 4, 0},
      {"gpt2-tiny", 2, 1, 1, "1f1b", 0, 4, 1},
      {"llama-tiny", 2, 1, 1, "gpipe", 0, 4, 1, "profile"},
      {"llama-tiny", 2, 1, 1, "1f1b", 0, 1, 0},  // fewer micro-batches than stages
      {"gpt2-tiny", 1, 1, 2, "1f1b", 0, 2, 0, "uniform", "bf16"},
      {"llama-tiny", 2, 1, 1, "1f1b", 0, 4, 1, "uniform", "bf16"},
      {"llama-tiny", 1, 1, 2, "1f1b", 0, 2, 0, "uniform", "fp32", 1, "model.qkv_bias=true"},  // Qwen2's biases
      // Packed documents: positions reach every stage and every tp slice's attention.
      {"llama-tiny", 2, 1, 1, "1f1b", 0, 4, 1, "uniform", "fp32", 1, "", false, true},
      {"gpt2-tiny", 1, 1, 2, "1f1b", 0, 2, 0, "uniform", "fp32", 1, "", false, true},
      {"gpt2-tiny", 2, 1, 1, "1f1b", 0, 4, 0, "uniform", "fp32", 1, kInterleaved2},  // tied table across the ring
      {"llama-tiny", 2, 1, 1, "1f1b", 0, 2, 1, "uniform", "fp32", 1, kInterleaved2},
      {"gpt2-tiny", 2, 1, 1, "zb1p", 0, 4, 0},                               // zero-bubble: weight passes deferred
      {"llama-tiny", 2, 1, 1, "zb1p", 0, 4, 0, "uniform", "bf16"},           // 16-bit saved activations re-read
      {"gpt2-tiny", 2, 1, 1, "zbv", 0, 4, 0, "uniform", "fp32", 1, kVee2},   // one tied table: stage 0 holds both ends
      {"llama-tiny", 2, 1, 1, "zbv", 0, 8, 0, "uniform", "bf16", 1, kVee2},  // 16-bit wire and activations
      {"llama-tiny", 2, 1, 1, "zbv", 0, 4, 0, "uniform", "fp32", 1, kVee2, false, true},  // packed rows
      // 4 ranks: pp=2 x dp=2 (ZeRO-0 and -1); tp=2 x pp=2; tp=4 (LLaMA's 2 kv heads replicated).
      {"gpt2-tiny", 2, 2, 1, "1f1b", 1, 2, 0},
      {"llama-tiny", 2, 2, 1, "gpipe", 0, 2, 1, "parameters"},
      {"gpt2-tiny", 2, 1, 2, "1f1b", 0, 4, 1},
      {"llama-tiny", 2, 1, 2, "gpipe", 0, 4, 0},
      {"llama-tiny", 1, 1, 4, "1f1b", 0, 2, 0},
      {"gpt2-tiny", 1, 2, 2, "1f1b", 3, 2, 1},   // ZeRO-3 shards of tp slices
      {"llama-tiny", 1, 2, 2, "1f1b", 2, 1, 0},  // ZeRO-2
      {"gpt2-tiny", 1, 2, 2, "1f1b", 3, 2, 1, "uniform", "bf16"},
      {"llama-tiny", 2, 2, 1, "gpipe", 0, 2, 1, "uniform", "bf16"},
      {"llama-tiny", 1, 1, 4, "1f1b", 0, 2, 0, "uniform", "bf16"},  // kv heads expanded, 16-bit activations
      {"llama-tiny", 1, 1, 4, "1f1b", 0, 2, 0, "uniform", "fp32", 1, "model.qkv_bias=true"},  // replicated k/v biases
      {"gpt2-tiny", 2, 2, 1, "1f1b", 1, 2, 0, "uniform", "bf16", 1, "", true},  // tied copy in the replica
      {"llama-tiny", 2, 1, 2, "gpipe", 0, 4, 0, "uniform", "fp32", 1, "", false, true},
      {"llama-tiny", 4, 1, 1, "1f1b", 0, 4, 0, "uniform", "fp32", 1, kInterleaved4},
      {"gpt2-tiny", 2, 2, 1, "1f1b", 1, 2, 1, "uniform", "fp32", 1, kInterleaved2},  // dp buckets across chunks
      {"llama-tiny", 4, 1, 1, "zb1p", 0, 4, 0, "uniform", "fp32", 1, "model.n_layer=4"},
      {"gpt2-tiny", 2, 2, 1, "zb1p", 1, 2, 0},  // dp reduction after the last weight pass
      {"llama-tiny", 4, 1, 1, "zbv", 0, 8, 0, "uniform", "fp32", 1, kVee4},
      {"gpt2-tiny", 2, 2, 1, "zbv", 1, 4, 0, "uniform", "fp32", 1, kVee2},  // dp buckets of both ends on stage 0
      {"llama-tiny", 2, 1, 2, "zbv", 0, 4, 0, "uniform", "fp32", 1, kVee2},
      // 8 ranks: dp=2 x tp=2 x pp=2.
      {"gpt2-tiny", 2, 2, 2, "1f1b", 1, 2, 1},
      {"llama-tiny", 2, 2, 2, "gpipe", 0, 2, 0},
      {"llama-tiny", 1, 2, 4, "1f1b", 2, 2, 0},  // ZeRO-2, replicated kv heads summed in shards
      {"llama-tiny", 2, 2, 2, "gpipe", 0, 2, 0, "uniform", "bf16"},
      {"llama-tiny", 1, 2, 4, "1f1b", 2, 2, 0, "uniform", "bf16", 1, "", true},  // ZeRO-2 replica of tp slices
      {"gpt2-tiny", 4, 2, 1, "1f1b", 1, 4, 0, "uniform", "fp32", 1, kInterleaved4},
      {"llama-tiny", 2, 2, 2, "1f1b", 0, 2, 0, "uniform", "fp32", 1, kInterleaved2},
      {"llama-tiny", 2, 2, 2, "zb1p", 1, 2, 0},
      {"gpt2-tiny", 2, 2, 2, "zbv", 1, 2, 0, "uniform", "fp32", 1, kVee2},
      {"llama-tiny", 4, 2, 1, "zbv", 1, 4, 0, "uniform", "fp32", 1, kVee4},
      // Mixture of Experts. 2 ranks: dp=2 with ZeRO-3 (expert units of their own, ep=1); ep=2
      // alone and with ZeRO-3 (dense units sharded over both ranks, experts not at all).
      {"llama-moe-tiny", 1, 2, 1, "1f1b", 3, 2, 1, "uniform", "fp32", 1, kSharedExpert},
      {"llama-moe-tiny", 1, 1, 1, "1f1b", 0, 2, 0, "uniform", "fp32", 2},
      {"llama-moe-tiny", 1, 1, 1, "1f1b", 3, 1, 1, "uniform", "fp32", 2, kSharedExpert},
      {"gpt2-tiny", 1, 1, 1, "1f1b", 2, 2, 0, "uniform", "fp32", 2, kGpt2Moe},
      // 4 ranks: ep=4; dp=2 x ep=2 (ZeRO-1 and -3: experts sharded over dp); pp=2 x ep=2; tp=2 x ep=2.
      {"llama-moe-tiny", 1, 1, 1, "1f1b", 0, 2, 0, "uniform", "fp32", 4, kSharedExpert},
      {"llama-moe-tiny", 1, 2, 1, "1f1b", 1, 2, 0, "uniform", "fp32", 2},
      {"llama-moe-tiny", 1, 2, 1, "1f1b", 3, 1, 1, "uniform", "fp32", 2, kSharedExpert},
      {"llama-moe-tiny", 2, 1, 1, "1f1b", 0, 4, 0, "uniform", "fp32", 2},
      {"llama-moe-tiny", 2, 1, 1, "zb1p", 0, 4, 0, "uniform", "fp32", 2},  // MoE MLPs not deferred
      {"llama-moe-tiny", 2, 1, 1, "zbv", 0, 4, 0, "uniform", "fp32", 2, kVee2},
      {"llama-moe-tiny", 1, 1, 2, "1f1b", 0, 2, 0, "uniform", "fp32", 2, kSharedExpert},
      // 8 ranks: pp=2 x dp=2 x ep=2.
      {"llama-moe-tiny", 2, 2, 1, "gpipe", 1, 2, 0, "uniform", "fp32", 2},
  };
  return all;
}

TrainConfig make_config(const Layout& l, int64_t steps, const std::string& ckpt_dir = "") {
  std::vector<std::string> sets = {"model.preset=" + std::string(l.preset),
                                   "model.activation_checkpoint_interval=" + std::to_string(l.ckpt),
                                   "model.precision=" + std::string(l.precision),
                                   "data.dir=unused",
                                   "data.seq_len=16",
                                   "data.batch_size=8",
                                   "optim.lr=3e-3",
                                   "schedule.steps=" + std::to_string(steps),
                                   "schedule.warmup_steps=2",
                                   "schedule.eval_interval=0",
                                   "schedule.eval_batches=4",
                                   "log.every=1000",
                                   "log.progress=off",
                                   "parallel.dp=" + std::to_string(l.dp),
                                   "parallel.tp=" + std::to_string(l.tp),
                                   "parallel.pp=" + std::to_string(l.pp),
                                   "parallel.pp_schedule=" + std::string(l.schedule),
                                   "parallel.zero_stage=" + std::to_string(l.zero),
                                   "parallel.micro_batches=" + std::to_string(l.micro_batches),
                                   "parallel.pp_partition=" + std::string(l.partition),
                                   "parallel.ep=" + std::to_string(l.ep),
                                   "parallel.bucket_mb=0.01"};
  std::istringstream extra(l.extra);
  for (std::string kv; extra >> kv;)  // a one-process reference has no pipeline to interleave
    if (l.pp > 1 || kv.rfind("parallel.virtual_stages=", 0) != 0) sets.push_back(kv);
  if (l.replica) sets.push_back("parallel.weight_replica=on");
  if (!ckpt_dir.empty()) sets.push_back("checkpoint.dir=" + ckpt_dir);
  return parse_train_config("{}", sets);
}

struct TrainRun {
  std::vector<double> losses;
  double val_loss = 0;
  std::vector<float> weights;
  std::unique_ptr<model::ParamLayout> layout;  // of `weights`
  // Model-parallel copies that must stay identical: per world rank, its local weights.
  std::vector<float> local;
  std::unique_ptr<model::ParamLayout> local_layout;
};

TrainRun run_training(const TrainConfig& cfg, const parallel::Mesh* mesh, const std::string& resume = "",
                      int64_t stop = -1, bool packed = false) {
  SyntheticSource src(cfg.model.vocab_size, packed);
  const TrainerOptions o = loom::testing::quiet_trainer_options(mesh, resume, stop);
  TrainRun r;
  {
    Trainer t(cfg, src, o);
    const TrainResult res = t.run();
    r.losses = res.losses;
    r.val_loss = res.final_val_loss;
    r.weights = t.full_params().to_f32_vector();
    r.layout = std::make_unique<model::ParamLayout>(t.full_layout());
    if (t.data_parallel().params_are_masters()) {
      r.local = t.model().params().to_f32_vector();
    } else if (t.data_parallel().zero_stage() < 3) {  // ZeRO-1/2 with 16-bit gathers: the owners' masters
      Tensor masters = Tensor::zeros({t.model().flat_size()}, DType::f32);
      t.data_parallel().gather_full_params(masters);
      r.local = masters.to_f32_vector();
    }  // not under ZeRO-3
    r.local_layout = std::make_unique<model::ParamLayout>(t.model().layout());
  }
  return r;
}

void expect_close(const TrainRun& a, const TrainRun& ref, const std::string& what, bool bf16) {
  ASSERT_EQ(a.losses.size(), ref.losses.size()) << what;
  const double rel = bf16 ? loom::testing::kBf16LossTolerance : 1e-5;
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], ref.losses[i], rel * std::abs(ref.losses[i]) + 2e-7) << what << ": loss at step " << i + 1;
  EXPECT_NEAR(a.val_loss, ref.val_loss, rel * std::abs(ref.val_loss)) << what << ": validation loss";
  loom::testing::expect_weights_close(a.weights, *a.layout, ref.weights, *ref.layout, 3e-3, double(a.losses.size()),
                                      what,
                                      bf16 ? loom::testing::bf16_weight_tolerance() : loom::testing::WeightTolerance{});
}

// Copies that must agree bitwise: the tied token table on the first and last stage, and
// every tp-replicated parameter on each tp rank. Each (dp = 0) rank writes its copies into
// its own slot of a world-wide buffer: slot = tp rank, or tp + 1 for the last stage's table.
void expect_copies_identical(const TrainRun& r, const parallel::Mesh& mesh, const std::string& what) {
  if (r.local.empty()) return;
  const model::ParamLayout& local = *r.local_layout;
  const int64_t W = r.layout->total(), tp = mesh.shape().size(parallel::Dim::tp);
  Tensor slots = Tensor::zeros({(tp + 2) * W}, DType::f32, MemCategory::workspace);
  Tensor written = Tensor::zeros({(tp + 2) * W}, DType::f32, MemCategory::workspace);
  if (mesh.coord().dp == 0) {
    float* s = slots.data<float>();
    float* w = written.data<float>();
    for (const auto& p : local.params()) {
      const bool table = p.name == "transformer.wte.weight" || p.name == "model.embed_tokens.weight";
      if (!p.tp_replicated && !(table && local.config().tied_embeddings)) continue;
      const int64_t slot = p.tied_copy ? tp + 1 : p.tp_replicated ? mesh.coord().tp : tp;
      const int64_t base = slot * W + r.layout->get(p.name).offset;
      for (const auto& run : local.element_runs(p))
        for (int64_t i = 0; i < run.n; ++i) {
          s[base + run.global + i] = r.local[size_t(p.offset + run.local + i)];
          w[base + run.global + i] = 1;
        }
    }
  }
  mesh.world().all_reduce(slots);
  mesh.world().all_reduce(written);
  const float* s = slots.data<float>();
  const float* w = written.data<float>();
  int64_t compared = 0;
  for (int64_t i = 0; i < W; ++i) {
    for (int64_t k = 1; k < tp; ++k)  // replicated: tp rank k against tp rank 0
      if (w[k * W + i] > 0) {
        ASSERT_EQ(s[k * W + i], s[i]) << what << ": tp rank " << k << " differs at whole-model element " << i;
        ++compared;
      }
    if (w[(tp + 1) * W + i] > 0) {  // the last stage's table against the first stage's
      ASSERT_EQ(w[tp * W + i], w[(tp + 1) * W + i]);
      ASSERT_EQ(s[(tp + 1) * W + i], s[tp * W + i]) << what << ": tied table differs at element " << i;
      ++compared;
    }
  }
  // ZB-V's first stage holds both ends of the pipeline: one table, no copy.
  const bool expect_some = tp > 1 || (mesh.shape().size(parallel::Dim::pp) > 1 && local.config().tied_embeddings &&
                                      local.slice().has_head != local.slice().has_embedding);
  if (expect_some) {
    EXPECT_GT(compared, 0) << what;
  }
}

// The whole model's weights or Adam moments as a checkpoint file holds them.
std::vector<float> whole_from_file(const model::ModelConfig& cfg, const std::string& file) {
  const model::ParamLayout whole(cfg, 1);
  Tensor t = Tensor::zeros({whole.total()}, DType::f32, MemCategory::workspace);
  model::load_hf_safetensors(cfg, whole, t, file);
  return t.to_f32_vector();
}

const Layout kOneProcess{"", 1, 1, 1, "1f1b", 0, 0, 0};
bool is_one_process(const Layout& l) { return l.micro_batches == 0; }

// A checkpoint saved by layout `a` after 5 of 10 steps resumes on layout `b` (kOneProcess: each
// rank alone, `a` then from rank 0's directory). What `b` loads is the saved state bitwise (its
// snapshot of the weights and both moments equals the files), and its 5 further steps match an
// uninterrupted one-process run of the same batches as closely as any layout does.
void expect_reshard(const Layout& a_in, const Layout& b_in, const std::string& base) {
  const comm::Group& world = test_world();
  const Layout& real = is_one_process(a_in) ? b_in : a_in;
  auto resolve = [&](const Layout& l) {
    if (!is_one_process(l)) return l;
    return Layout{real.preset, 1,         1,      1, "1f1b",    0, real.dp * real.ep * real.micro_batches,
                  real.ckpt,   "uniform", "fp32", 1, real.extra};
  };
  const Layout a = resolve(a_in), b = resolve(b_in);
  const std::string what = str_cat(describe(a), " -> ", describe(b));
  const int micro = b.dp * b.ep * b.micro_batches;  // MoE statistics are per micro-batch: keep them
  ASSERT_EQ(micro, a.dp * a.ep * a.micro_batches) << what;
  const Layout one{a.preset, 1, 1, 1, "1f1b", 0, micro, a.ckpt, "uniform", "fp32", 1, a.extra};
  TrainRun ref = run_training(make_config(one, 10), nullptr);
  ref.losses.erase(ref.losses.begin(), ref.losses.begin() + 5);
  const std::string mine = str_cat(base, "/rank", world.rank());
  std::optional<parallel::Mesh> mesh_a, mesh_b;
  if (!is_one_process(a_in)) mesh_a.emplace(world, parallel::MeshShape(a.pp, a.dp, a.ep, a.tp));
  if (!is_one_process(b_in)) mesh_b.emplace(world, parallel::MeshShape(b.pp, b.dp, b.ep, b.tp));
  const std::string a_dir = is_one_process(a_in) ? mine + "/a" : base + "/a";
  run_training(make_config(a, 10, a_dir), mesh_a ? &*mesh_a : nullptr, "", 5);
  world.barrier();
  const std::string saved = (is_one_process(a_in) ? base + "/rank0/a" : a_dir) + "/step_000005";
  const std::string b_dir = is_one_process(b_in) ? mine + "/b" : base + "/b";
  const TrainConfig b_cfg = make_config(b, 10, b_dir);
  {
    SyntheticSource src(b_cfg.model.vocab_size);
    Trainer t(b_cfg, src, loom::testing::quiet_trainer_options(mesh_b ? &*mesh_b : nullptr, saved, -1));
    ASSERT_EQ(t.step(), 5) << what;
    const CheckpointSnapshot s = snapshot_checkpoint(5, t.model(), t.data_parallel(), {}, t.model_parallel_info());
    if (s.weights.defined()) {  // rank 0 of b
      EXPECT_EQ(s.weights.to_f32_vector(), whole_from_file(b_cfg.model, saved + "/model.safetensors")) << what;
      EXPECT_EQ(s.exp_avg.to_f32_vector(), whole_from_file(b_cfg.model, saved + "/optimizer.exp_avg.safetensors"))
          << what;
      EXPECT_EQ(s.exp_avg_sq.to_f32_vector(), whole_from_file(b_cfg.model, saved + "/optimizer.exp_avg_sq.safetensors"))
          << what;
    }
  }
  TrainRun r = run_training(b_cfg, mesh_b ? &*mesh_b : nullptr, saved);
  r.val_loss = ref.val_loss;  // not compared: the one-process reference is the judge of the steps
  expect_close(r, ref, what, false);
  world.barrier();
}

}  // namespace

TEST(ModelParallelEquivalence, LayoutsOfThisWorldSizeMatchOneProcess) {
  const comm::Group& world = test_world();
  const int N = world.size();
  int ran = 0;
  std::map<std::string, TrainRun> refs;  // by preset and checkpointing
  for (const Layout& l : layouts()) {
    if (l.pp * l.dp * l.ep * l.tp != N) continue;
    const int64_t steps = 20;
    // One process, the same global batch in micro-batches of the same size (so that the
    // validation batches, which have the micro-batch size, are the same too).
    // (Each MoE micro-batch routes, drops and balances its own tokens, so the micro-batches
    // must be the same ones.)
    const int ref_micro_batches = l.dp * l.ep * l.micro_batches;
    const std::string key = str_cat(l.preset, l.ckpt, "/", ref_micro_batches, l.precision, l.extra, l.packed);
    if (!refs.count(key)) {
      Layout one{l.preset, 1, 1, 1, "1f1b", 0, ref_micro_batches, l.ckpt, "uniform", l.precision, 1, l.extra};
      refs[key] = run_training(make_config(one, steps), nullptr, "", -1, l.packed);
    }
    parallel::Mesh mesh(world, parallel::MeshShape(l.pp, l.dp, l.ep, l.tp));
    const TrainRun r = run_training(make_config(l, steps), &mesh, "", -1, l.packed);
    expect_close(r, refs[key], describe(l), std::string(l.precision) == "bf16");
    expect_copies_identical(r, mesh, describe(l));
    ++ran;
  }
  EXPECT_GT(ran, 0) << "no layout for " << N << " ranks";
}

TEST(ModelParallelResume, ThreeDimensionalRunResumesExactlyOnTheSameLayout) {
  const comm::Group& world = test_world();
  const int N = world.size();
  if (N != 8) GTEST_SKIP() << "needs dp=2 x tp=2 x pp=2 = 8 ranks";
  const Layout l{"llama-tiny", 2, 2, 2, "1f1b", 1, 2, 1};
  parallel::Mesh mesh(world, parallel::MeshShape(2, 2, 1, 2));
  const std::string dir = (std::filesystem::temp_directory_path() / "loom_mp_resume").string();
  if (world.rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(dir + "_straight");
  }
  world.barrier();
  const TrainRun straight = run_training(make_config(l, 10, dir + "_straight"), &mesh);
  run_training(make_config(l, 10, dir), &mesh, "", 5);                            // 5 steps, checkpoint
  const TrainRun resumed = run_training(make_config(l, 10, dir), &mesh, "auto");  // the other 5
  ASSERT_EQ(resumed.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[5 + i]) << "step " << 6 + i;
  EXPECT_EQ(resumed.weights, straight.weights) << "weights differ bitwise after resume";
}

TEST(ModelParallelResume, ExpertParallelRunResumesExactlyAndItsWeightsLoadInOneProcess) {
  const comm::Group& world = test_world();
  if (world.size() != 4) GTEST_SKIP() << "needs dp=2 x ep=2 = 4 ranks";
  // ZeRO-3 shards dense units over all 4 ranks and each expert unit over its 2 holders; the
  // balancing bias moves every step and must come back too.
  const Layout l{"llama-moe-tiny",
                 1,
                 2,
                 1,
                 "1f1b",
                 3,
                 1,
                 0,
                 "uniform",
                 "fp32",
                 2,
                 "model.moe.bias_update_rate=0.01 model.moe.capacity_factor=1.25 model.moe.num_shared_experts=1"};
  parallel::Mesh mesh(world, parallel::MeshShape(1, 2, 2, 1));
  const std::string dir = (std::filesystem::temp_directory_path() / "loom_ep_resume").string();
  if (world.rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(dir + "_straight");
  }
  world.barrier();
  const TrainRun straight = run_training(make_config(l, 10, dir + "_straight"), &mesh);
  run_training(make_config(l, 10, dir), &mesh, "", 5);
  const TrainRun resumed = run_training(make_config(l, 10, dir), &mesh, "auto");
  ASSERT_EQ(resumed.losses.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[5 + i]) << "step " << 6 + i;
  EXPECT_EQ(resumed.weights, straight.weights) << "weights differ bitwise after resume";
  // Experts are saved per expert under Mixtral's names: one process (ep=1) loads them all.
  if (world.rank() == 0) {
    const TrainConfig cfg = make_config(l, 10, dir);
    model::Decoder one(cfg.model);
    load_checkpoint_weights(dir + "/step_000010", one);
    EXPECT_EQ(one.params().to_f32_vector(), resumed.weights) << "ep=1 load of the ep=2 checkpoint";
    EXPECT_TRUE(one.layout().contains("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
    const Tensor& b = one.router_bias();
    ASSERT_TRUE(b.defined());
    bool moved = false;
    for (int64_t i = 0; i < b.numel(); ++i) moved = moved || b.data<float>()[i] != 0.f;
    EXPECT_TRUE(moved) << "the balancing bias was not restored";
  }
}

// Checkpoints are layout-independent: each transition saves on one layout and resumes on another
// of the same world (or in one process), across tp, pp, dp, ep and ZeRO stages.
TEST(ModelParallelResume, CheckpointsReshardAcrossEveryLayout) {
  const comm::Group& world = test_world();
  const int N = world.size();
  const std::string base = loom::testing::shared_empty_dir(world, "loom_mp_reshard");
  std::vector<std::pair<Layout, Layout>> transitions;
  if (N == 2) {
    transitions = {
        {{"llama-tiny", 1, 1, 2, "1f1b", 0, 2, 0}, {"llama-tiny", 2, 1, 1, "1f1b", 0, 2, 0}},  // tp=2 -> pp=2
        {{"gpt2-tiny", 2, 1, 1, "gpipe", 0, 4, 0}, {"gpt2-tiny", 1, 2, 1, "1f1b", 3, 2, 0}},   // pp=2 -> dp=2 ZeRO-3
        {{"llama-moe-tiny", 1, 1, 1, "1f1b", 0, 2, 0, "uniform", "fp32", 2},                   // ep=2 -> dp=2 ZeRO-1
         {"llama-moe-tiny", 1, 2, 1, "1f1b", 1, 2, 0}},
        {{"llama-tiny", 1, 1, 2, "1f1b", 0, 2, 0}, kOneProcess},  // tp=2 -> one process
        // Interleaved stages (blocks 0, 2 | 1, 3) save and load like any other layout.
        {{"gpt2-tiny", 2, 1, 1, "1f1b", 0, 2, 0, "uniform", "fp32", 1, kInterleaved2}, kOneProcess},
        {{"gpt2-tiny", 1, 2, 1, "1f1b", 1, 2, 0, "uniform", "fp32", 1, "model.n_layer=4"},
         {"gpt2-tiny", 2, 1, 1, "1f1b", 0, 4, 0, "uniform", "fp32", 1, kInterleaved2}},  // dp=2 -> interleaved pp=2
        // ZB-V stages (blocks 0, 3 | 1, 2; both ends on stage 0) to and from other layouts.
        {{"gpt2-tiny", 2, 1, 1, "zbv", 0, 4, 0, "uniform", "fp32", 1, kVee2},
         {"gpt2-tiny", 2, 1, 1, "1f1b", 0, 4, 0, "uniform", "fp32", 1, kInterleaved2}},  // zbv -> interleaved
        {{"llama-tiny", 1, 2, 1, "1f1b", 1, 2, 0, "uniform", "fp32", 1, kVee2},
         {"llama-tiny", 2, 1, 1, "zbv", 0, 4, 0, "uniform", "fp32", 1, kVee2}},  // dp=2 -> zbv
    };
  } else if (N == 4) {
    transitions = {
        {{"llama-tiny", 2, 2, 1, "gpipe", 1, 2, 1, "parameters"}, {"llama-tiny", 1, 1, 4, "1f1b", 0, 4, 0}},
        {{"llama-moe-tiny", 1, 2, 1, "1f1b", 3, 1, 1, "uniform", "fp32", 2, kSharedExpert},
         {"llama-moe-tiny", 1, 1, 2, "1f1b", 0, 2, 0, "uniform", "fp32", 2, kSharedExpert}},  // dp2 x ep2 -> tp2 x ep2
        {kOneProcess, {"gpt2-tiny", 2, 1, 2, "1f1b", 0, 4, 1}},                          // one process -> pp2 x tp2
        {{"llama-tiny", 4, 1, 1, "1f1b", 0, 4, 1, "uniform", "fp32", 1, kInterleaved4},  // interleaved pp4 -> pp4
         {"llama-tiny", 4, 1, 1, "1f1b", 0, 4, 0, "uniform", "fp32", 1, "model.n_layer=8"}},
        {{"llama-tiny", 4, 1, 1, "zbv", 0, 4, 0, "uniform", "fp32", 1, kVee4},  // zbv pp4 -> pp2 x dp2
         {"llama-tiny", 2, 2, 1, "1f1b", 1, 2, 0, "uniform", "fp32", 1, kVee4}},
    };
  } else if (N == 8) {
    transitions = {
        {{"llama-tiny", 2, 2, 2, "1f1b", 1, 2, 1}, {"llama-tiny", 2, 1, 4, "gpipe", 0, 4, 1}},  // 3D -> pp2 x tp4
        {{"llama-tiny", 2, 2, 2, "1f1b", 1, 2, 1}, {"llama-tiny", 1, 2, 4, "1f1b", 2, 2, 0}},  // 3D -> dp2 x tp4 ZeRO-2
        {{"llama-moe-tiny", 2, 2, 1, "gpipe", 1, 2, 0, "uniform", "fp32", 2}, kOneProcess},
    };
  }
  if (transitions.empty()) GTEST_SKIP() << "no transitions for " << N << " ranks";
  for (size_t i = 0; i < transitions.size(); ++i)
    expect_reshard(transitions[i].first, transitions[i].second, str_cat(base, "/t", i));
}

// parallel.pp_dtype (default: model.precision's): activations and their gradients cross the
// stage boundary in 16 bits. Half the bytes of every send, exactly; the next stage starts from
// the rounded residual stream, so the run moves (it must: the rounding happened) but stays within
// the bf16 tolerance of the f32-wire run.
TEST(ModelParallelPipelineWire, SixteenBitActivationsHalveTheSendsWithinTheBf16Tolerance) {
  const comm::Group& world = test_world();
  if (world.size() != 2) GTEST_SKIP() << "needs pp=2 = 2 ranks";
  parallel::Mesh mesh(world, parallel::MeshShape(2, 1, 1, 1));
  for (const char* precision : {"bf16", "fp16"}) {
    const Layout l{"llama-tiny", 2, 1, 1, "1f1b", 0, 4, 1, "uniform", precision};
    TrainRun runs[2];
    double bytes[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      TrainConfig cfg = make_config(l, 20);
      ASSERT_EQ(cfg.parallel.pp_dtype, wire_dtype(precision)) << "the default follows model.precision";
      if (k == 0) cfg.parallel.pp_dtype = DType::f32;
      const double t0 = now_seconds();
      runs[k] = run_training(cfg, &mesh);
      for (const auto& e : world.record().finished())
        if (e.t_start >= t0 && e.op == "send") bytes[k] += double(e.bytes);
    }
    const std::string what = str_cat("pp=2 ", precision);
    EXPECT_GT(bytes[0], 0) << what;
    EXPECT_EQ(bytes[1] * 2, bytes[0]) << what << ": sends of " << bytes[1] << " bytes, f32 " << bytes[0];
    EXPECT_NE(runs[1].losses, runs[0].losses) << what << ": the 16-bit wire changed nothing";
    expect_close(runs[1], runs[0], what, true);
  }
}

// parallel.offload on a pp=2 layout whose first stage holds two of the three blocks: `auto`
// offloads that stage's Adam moments alone (its predicted memory is over the stages' mean by more
// than a tenth), and the run's losses and weights equal bitwise those of the run that keeps them
// resident, from disk and from the host pool. A memory limit that stage exceeds with its moments
// resident is refused on every rank, naming the stage and the fix, and met once they are on disk.
TEST(ModelParallelOffload, TheHeavyStageOffloadsAndTrainsBitwiseLikeResident) {
  const comm::Group& world = test_world();
  if (world.size() != 2) GTEST_SKIP() << "needs pp=2 = 2 ranks";
  parallel::Mesh mesh(world, parallel::MeshShape(2, 1, 1, 1));
  const std::string dir = loom::testing::shared_empty_dir(world, "offload");
  auto config = [&](const std::string& extra) {
    const std::string sets = "model.n_layer=3 " + extra;
    return make_config({"llama-tiny", 2, 1, 1, "1f1b", 0, 4, 0, "uniform", "fp32", 1, sets.c_str()}, 6);
  };
  auto train = [&](const std::string& extra, bool offloads) {
    const TrainConfig cfg = config(extra);
    SyntheticSource src(cfg.model.vocab_size);
    Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh));
    EXPECT_EQ(t.data_parallel().optimizer_offload() != nullptr, offloads && mesh.coord().pp == 0)
        << extra << " on stage " << mesh.coord().pp;
    const TrainResult res = t.run();
    return std::pair{res.losses, t.full_params().to_f32_vector()};
  };
  const auto resident = train("", false);
  for (const char* target : {"disk", "host"}) {
    SCOPED_TRACE(target);
    const auto off = train(str_cat("parallel.offload.optimizer=", target, " parallel.offload.dir=", dir), true);
    EXPECT_EQ(off.first, resident.first);
    EXPECT_EQ(off.second, resident.second);
  }
  // A limit halfway between what stage 0 needs with its moments resident (16 bytes a parameter
  // at ZeRO-0) and on disk (8): stage 1, a block lighter, fits under it either way.
  const TrainConfig cfg = config("");
  auto states = [&](int first, int last, bool emb, bool head) {
    return 16.0 * double(model::ParamLayout(cfg.model, 1, model::ModelSlice{first, last, emb, head}).total());
  };
  const double act = model::estimate_training_bytes(cfg.model, 0, double(cfg.data.micro_batch_size), cfg.data.seq_len,
                                                    0, cfg.decoder.xent_chunk) /
                     2;
  const double s0 = states(0, 2, true, false), s1 = states(2, 3, false, true);
  ASSERT_LT(s1, 0.75 * s0);
  const std::string limit = str_cat(" parallel.memory_limit_mb=", (s0 * 0.75 + act) / 1048576.0);
  const std::string err = loom::testing::error_of([&] { train(limit, false); });
  EXPECT_NE(err.find("[train] pipeline stage 0 needs about "), std::string::npos) << err;
  EXPECT_NE(err.find("; offload its optimizer state (parallel.offload.optimizer=disk or host)"), std::string::npos)
      << err;
  const auto off = train("parallel.offload.optimizer=disk parallel.offload.dir=" + dir + limit, true);
  EXPECT_EQ(off.second, resident.second);
  world.barrier();
}

TEST(ModelParallelErrors, LayoutNotMatchingTheWorldIsRefusedWithTheArithmetic) {
  const comm::Group& world = test_world();
  const int N = world.size();
  try {
    parallel::Mesh mesh(world, parallel::MeshShape(2, N, 1, 1));
    ADD_FAILURE() << "pp=2 x dp=" << N << " on " << N << " ranks should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(str_cat("world size ", N, " does not match pp=2 x dp=", N)), std::string::npos)
        << e.what();
  }
}

// parallel.offload.params: ZeRO-3's parameter shards live on disk or in the host pool between
// uses (staged a unit at a time for the all-gathers and the update), with or without the moments
// beside them. The run is bitwise the resident one, losses and weights; the shards never count
// as resident parameters beyond the staged chunks, from construction on (nor the moments as
// optimizer state beyond their staging buffers); a checkpoint saved from offloaded shards resumes into
// offloaded shards exactly; a limit that the resident states exceed is met once they are off;
// and below ZeRO-3 the setting is refused naming the stage.
TEST(ModelParallelOffload, ZeroThreeParameterShardsOffloadAndTrainBitwiseLikeResident) {
  const comm::Group& world = test_world();
  if (world.size() != 2) GTEST_SKIP() << "needs dp=2 = 2 ranks";
  parallel::Mesh mesh(world, parallel::MeshShape(1, 2, 1, 1));
  const std::string dir = loom::testing::shared_empty_dir(world, "offload_params");
  auto config = [&](const std::string& extra, int64_t steps, const std::string& ckpt = "") {
    const std::string sets = "model.n_layer=8 " + extra;  // ten units: a few staged at once
    return make_config({"llama-tiny", 1, 2, 1, "1f1b", 3, 2, 0, "uniform", "fp32", 1, sets.c_str()}, steps, ckpt);
  };
  auto train = [&](const std::string& extra, bool offloads) {
    const TrainConfig cfg = config(extra, 6);
    SyntheticSource src(cfg.model.vocab_size);
    // The last run's shard goes when the communication thread drops its last gather.
    for (int i = 0; i < 1000 && cpu_allocator().snapshot()[MemCategory::params].current +
                                        cpu_allocator().snapshot()[MemCategory::optimizer].current >
                                    0;
         ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    cpu_allocator().reset_peaks();
    Trainer t(cfg, src, loom::testing::quiet_trainer_options(&mesh));
    EXPECT_EQ(t.data_parallel().offloaded_param_bytes() > 0, offloads) << extra;
    const TrainResult res = t.run();
    const MemorySnapshot mem = cpu_allocator().snapshot();  // construction included
    return std::tuple{res.losses, t.full_params().to_f32_vector(), mem[MemCategory::params],
                      mem[MemCategory::optimizer]};
  };
  const auto resident = train("", false);
  const std::string at = " parallel.offload.stages=[0] parallel.offload.dir=" + dir;
  for (const char* set : {"parallel.offload.params=disk", "parallel.offload.params=host",
                          "parallel.offload.params=disk parallel.offload.optimizer=host"}) {
    SCOPED_TRACE(set);
    const auto off = train(set + at, true);
    EXPECT_EQ(std::get<0>(off), std::get<0>(resident));
    EXPECT_EQ(std::get<1>(off), std::get<1>(resident));
    EXPECT_LT(std::get<2>(off).peak, std::get<2>(resident).peak) << "the whole shard was resident at some point";
    EXPECT_LT(std::get<2>(off).current, std::get<2>(resident).current / 4) << "chunks stayed staged after the step";
    if (std::string(set).find("optimizer") != std::string::npos) {  // the moments never resident either
      EXPECT_LT(std::get<3>(off).peak, std::get<3>(resident).peak / 2);
    }
  }
  // Saved after 3 steps from offloaded shards and resumed into them: the uninterrupted run's.
  const std::string ckpt = dir + "/ckpt";
  const std::string set = "parallel.offload.params=disk" + at;
  run_training(config(set, 6, ckpt), &mesh, "", 3);
  const TrainRun resumed = run_training(config(set, 6, ckpt), &mesh, "auto");  // the other 3
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed.losses[i], std::get<0>(resident)[3 + i]) << "step " << 4 + i;
  EXPECT_EQ(resumed.weights, std::get<1>(resident));
  const std::string err = loom::testing::error_of([&] {
    make_config({"llama-tiny", 1, 2, 1, "1f1b", 1, 2, 0, "uniform", "fp32", 1, "parallel.offload.params=disk"}, 6);
  });
  EXPECT_NE(err.find("parallel.offload.params=disk keeps ZeRO-3's parameter shards off the device, but "
                     "parallel.zero_stage=1"),
            std::string::npos)
      << err;
  world.barrier();
}
