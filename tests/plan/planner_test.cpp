// The planner's closed forms: cluster files, memory per rank against the estimators it stands
// on, the pipeline bubble, data-parallel overlap, layout checks and the search order.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "loom/core/error.h"
#include "loom/model/memory_estimate.h"
#include "loom/plan/planner.h"

namespace loom::plan {
namespace {

const std::string kClusters = std::string(LOOM_SOURCE_DIR) + "/configs/clusters/";

Cluster small_cluster(int devices = 4) {
  return parse_cluster(str_cat("name: test\nnode:\n  devices: ", devices,
                               "\n  device_memory_gib: 16\n  peak_fp32_tflops: 0.1\n  memory_gbps: 20\n"
                               "  gemm_efficiency: [[0.001, 0.5], [1, 1.0]]\n"
                               "links:\n  intra: {alpha_us: 5, gbps: 10}\n  inter: {alpha_us: 50, gbps: 1}\n"),
                       "test.yaml");
}

Job job_of(const char* preset, int64_t batch, int64_t seq) {
  Job j;
  j.model = model::preset(preset);
  j.global_batch = batch;
  j.seq = seq;
  return j;
}

TEST(Cluster, PublicFilesLoadAndRoundTrip) {
  for (const char* f : {"dgx-a100-80g.yaml", "dgx-h100.yaml"}) {
    const Cluster c = load_cluster(kClusters + f);
    EXPECT_EQ(c.devices_per_node, 8) << f;
    EXPECT_GT(c.device.peak_bf16_flops, 100e12) << f;
    EXPECT_FALSE(c.sources.empty()) << f << " must say where its numbers come from";
    const Cluster again = parse_cluster(cluster_yaml(c), "again");
    EXPECT_NEAR(again.device.peak_bf16_flops, c.device.peak_bf16_flops, 1e-6 * c.device.peak_bf16_flops);
    EXPECT_NEAR(again.links.inter.gbps(), c.links.inter.gbps(), 1e-3);
    EXPECT_EQ(again.device.gemm_efficiency.points.size(), c.device.gemm_efficiency.points.size());
  }
}

TEST(Cluster, BadFilesNameTheKey) {
  try {
    parse_cluster("name: x\nnode:\n  device_memory_gib: 1\n", "bad.yaml");
    FAIL() << "accepted a node without devices";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml: missing key 'node.devices'"), std::string::npos) << e.what();
  }
  try {
    parse_cluster("node: {devices: 2, device_memory_gib: 1, peak_fp32_tflops: -1, memory_gbps: 1}\n", "neg.yaml");
    FAIL() << "accepted a negative peak";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node.peak_fp32_tflops"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_cluster("/nonexistent/cluster.yaml"), Error);
}

// Nine nested levels of ten aliases would be 10^9 nodes to walk: refused at the first alias,
// naming the file and line, long before any expansion.
TEST(Cluster, YamlAliasesAreRefusedWithTheirLine) {
  std::string bomb = "name: bomb\na0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (int k = 1; k <= 9; ++k) {
    bomb += "a" + std::to_string(k) + ": &a" + std::to_string(k) + " [";
    for (int j = 0; j < 10; ++j) bomb += std::string(j ? ", " : "") + "*a" + std::to_string(k - 1);
    bomb += "]\n";
  }
  bomb += "node: {devices: 2, device_memory_gib: 1, peak_fp32_tflops: 1, memory_gbps: 1}\n";
  const auto start = std::chrono::steady_clock::now();
  try {
    parse_cluster(bomb, "bomb.yaml");
    FAIL() << "accepted a cluster file with aliases";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[plan] bomb.yaml:3: YAML aliases (*name) are not accepted"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(Cluster, CurveInterpolatesInLogSizeAndClamps) {
  Curve c{{{1e3, 0.2}, {1e5, 0.6}}};
  EXPECT_DOUBLE_EQ(c.at(10), 0.2);
  EXPECT_DOUBLE_EQ(c.at(1e9), 0.6);
  EXPECT_NEAR(c.at(1e4), 0.4, 1e-12);
}

TEST(Planner, OneRankMemoryIsTheTrainingEstimate) {
  const Job j = job_of("gpt2-shakespeare", 8, 128);
  for (int ckpt : {0, 1}) {
    Layout l;
    l.micro_batch = 8;
    l.checkpoint = ckpt;
    const Prediction p = predict(j, small_cluster(), l);
    ASSERT_TRUE(p.fits) << p.why_not;
    const int64_t P = model::ParamLayout(j.model).num_params();
    const auto est = model::estimate_training_memory(j.model, P, 8, 128, ckpt, j.xent_chunk);
    EXPECT_EQ(int64_t(p.memory.total()), est.total()) << "ckpt " << ckpt;
    EXPECT_EQ(p.memory.comm, 0);
  }
}

// fp32 Adam over 4 ranks, the stages of the ZeRO paper (Rajbhandari et al. 2020, sec. 5.1):
// weights 4P bytes, gradients 4P, Adam's two moments 8P; stage 1 shards the moments, stage 2
// the gradients too, stage 3 the weights too.
TEST(Planner, ZeroStagesShardTheStatesAsTheFormulasSay) {
  const Job j = job_of("gpt2-124m", 4, 64);
  const int64_t P = model::ParamLayout(j.model).num_params();
  ASSERT_EQ(P, 124439808) << "GPT-2 small's published parameter count (tied embeddings)";
  struct Expected {
    int64_t params, grads, optimizer;
  };
  const Expected expected[] = {{4 * P, 4 * P, 8 * P}, {4 * P, 4 * P, 2 * P}, {4 * P, P, 2 * P}, {P, P, 2 * P}};
  for (int zero = 0; zero <= 3; ++zero) {
    Layout l = Layout::of(4, 1, 1, 1, zero, 1, 1);
    const Prediction p = predict(j, small_cluster(), l);
    ASSERT_TRUE(p.why_not.empty()) << p.why_not;
    EXPECT_EQ(int64_t(p.memory.params), expected[zero].params) << "ZeRO-" << zero;
    EXPECT_EQ(int64_t(p.memory.grads), expected[zero].grads) << "ZeRO-" << zero;
    EXPECT_EQ(int64_t(p.memory.optimizer), expected[zero].optimizer) << "ZeRO-" << zero;
  }
}

// Under bf16, ZeRO-1/2 keep the 16-bit weight replica and the owned fp32 masters where that
// takes fewer bytes than a whole fp32 copy, as the trainer does (parallel.weight_replica=auto).
TEST(Planner, Bf16ZeroOneAndTwoKeepTheWeightReplicaWhereItIsSmaller) {
  Job j = job_of("gpt2-124m", 4, 64);
  j.bf16 = true;
  const model::ParamLayout layout(j.model);
  const int64_t P = layout.num_params();
  int64_t product = 0;
  for (const auto& p : layout.params())
    if (p.product_operand) product += p.numel();
  for (int zero = 1; zero <= 2; ++zero) {
    const Prediction four = predict(j, small_cluster(), Layout::of(4, 1, 1, 1, zero, 1, 1));
    ASSERT_TRUE(four.why_not.empty()) << four.why_not;
    EXPECT_EQ(int64_t(four.memory.params), 2 * product + 4 * (P - product)) << zero;
    EXPECT_EQ(int64_t(four.memory.optimizer), 12 * P / 4) << zero;
    EXPECT_EQ(int64_t(four.memory.grads), zero == 1 ? 4 * P : P) << zero;
    // Two ranks: GPT-2's f32 token table makes the replica and masters larger than 4P.
    const Prediction two = predict(j, small_cluster(), Layout::of(2, 1, 1, 1, zero, 2, 1));
    ASSERT_TRUE(two.why_not.empty()) << two.why_not;
    EXPECT_EQ(int64_t(two.memory.params), 4 * P) << zero;
    EXPECT_EQ(int64_t(two.memory.optimizer), 8 * P / 2) << zero;
  }
}

TEST(Planner, OneBitAdamAddsItsErrorBuffersAndKeepsToZeroOneWithoutEp) {
  Job j = job_of("gpt2-124m", 4, 64);
  j.grad_wire_bytes = 1.0 / 8;
  const int64_t P = model::ParamLayout(j.model).num_params();
  ASSERT_EQ(P % 4, 0) << "the literals below divide P by the 4 ranks exactly";
  // 1-bit Adam's compressed all-reduce (Tang et al. 2021) keeps an fp32 error for what the
  // sender's compression dropped, the whole gradient (4P bytes), and one for the chunk the rank
  // reduces, a quarter of it (P bytes), on top of Adam's moments: 8P unsharded, 8P/4 under ZeRO-1.
  const int64_t expected_optimizer[] = {8 * P + 4 * P + P, 2 * P + 4 * P + P};
  for (int zero = 0; zero <= 1; ++zero) {
    const Prediction p = predict(j, small_cluster(), Layout::of(4, 1, 1, 1, zero, 1, 1));
    ASSERT_TRUE(p.why_not.empty()) << p.why_not;
    EXPECT_EQ(int64_t(p.memory.optimizer), expected_optimizer[zero]) << "ZeRO-" << zero;
  }
  EXPECT_EQ(check_layout(j, small_cluster(), Layout::of(4, 1, 1, 1, 2, 1, 1)),
            "1-bit Adam with ZeRO-2 (loom's trainer runs it at ZeRO 0-1 without expert parallelism)");
}

TEST(Planner, PipelineBubbleOfEqualStagesIsTheScheduleFormula) {
  // A tiny vocabulary makes the embedding and head negligible, so the stages are equal.
  Job j = job_of("gpt2-350m", 32, 128);
  j.model.vocab_size = 16;
  for (int64_t m : {4, 8, 32}) {
    Layout l = Layout::of(1, 1, 4, 1, 0, 32 / m, m);
    const Prediction p = predict(j, small_cluster(), l);
    ASSERT_TRUE(p.why_not.empty()) << p.why_not;
    const TimePrediction& t = p.time;
    const double busy = t.gemm + t.attention + t.elementwise + t.pp_p2p;
    const double want = 3.0 / double(m + 3);
    EXPECT_NEAR(t.bubble / (busy + t.bubble), want, 0.02 * want + 1e-3) << "m=" << m;
  }
}

// ZB-H1's bubble: each other stage's F + B - W (W: the weight-gradient third of its matrix
// products), against 1F1B's F + B + W; the same layout otherwise, so everything but the bubble
// is predicted alike.
TEST(Planner, ZeroBubbleH1LeavesTheStagesFPlusBMinusWIdle) {
  Job j = job_of("gpt2-350m", 32, 128);
  j.model.vocab_size = 16;
  Layout one = Layout::of(1, 1, 4, 1, 0, 4, 8), zb = one;
  zb.pp_schedule = parallel::PipeSchedule::zero_bubble_h1;
  const Prediction a = predict(j, small_cluster(), one), b = predict(j, small_cluster(), zb);
  ASSERT_TRUE(a.why_not.empty() && b.why_not.empty()) << a.why_not << b.why_not;
  EXPECT_DOUBLE_EQ(a.time.gemm, b.time.gemm);
  // 8 micro-batches, 3 stages idle; the stages are equal to 0.1% (the 16-word embedding and head).
  const double per_stage = a.time.bubble / 3, w = a.time.gemm / 8 / 3;
  EXPECT_NEAR(b.time.bubble, 3 * (per_stage - 2 * w), 1e-3 * b.time.bubble);
  EXPECT_LT(b.time.bubble, 0.8 * a.time.bubble);
  EXPECT_LT(b.time.step, a.time.step);
}

// Interleaved 1F1B (v chunks a stage): a v-th of 1F1B's bubble, v times the stage's transfers, and
// the schedule's deeper warm-up in activation memory; layouts the trainer refuses are refused.
TEST(Planner, InterleavedStagesDivideTheBubbleAndHoldMoreActivations) {
  Job j = job_of("gpt2-350m", 32, 128);
  j.model.vocab_size = 16;
  Layout one = Layout::of(1, 1, 4, 1, 0, 4, 8), inter = one;
  inter.virtual_stages = 2;
  const Prediction a = predict(j, small_cluster(), one), b = predict(j, small_cluster(), inter);
  ASSERT_TRUE(a.why_not.empty() && b.why_not.empty()) << a.why_not << b.why_not;
  EXPECT_EQ(b.layout.describe(), "dp1 tp1 pp4 z0 mb4x8 1f1b v2");
  EXPECT_NEAR(b.time.bubble / a.time.bubble, 0.5, 0.01);  // the stages' transfers double too
  EXPECT_NEAR(b.time.pp_p2p, 2 * a.time.pp_p2p, 1e-9 * a.time.step);
  for (size_t s = 0; s < 4; ++s) EXPECT_GT(b.stage_memory[s].activations, a.stage_memory[s].activations) << s;
  Layout odd = inter;
  odd.micro_batches = 2, odd.micro_batch = 16;
  EXPECT_NE(check_layout(j, small_cluster(), odd).find("parallel.micro_batches=2 is not a multiple of 4"),
            std::string::npos)
      << check_layout(j, small_cluster(), odd);
  Layout gpipe = inter;
  gpipe.pp_schedule = parallel::PipeSchedule::gpipe;
  EXPECT_NE(check_layout(j, small_cluster(), gpipe), "");
  Layout zb_ckpt = one;
  zb_ckpt.pp_schedule = parallel::PipeSchedule::zero_bubble_h1;
  zb_ckpt.checkpoint = 1;
  EXPECT_NE(check_layout(j, small_cluster(), zb_ckpt).find("zb1p with activation checkpointing"), std::string::npos);
}

// ZB-V: its own schedule replayed with each stage's passes (W a third of the matrix products, F
// and B the rest alike), below ZB-H1's bubble; two transfers a micro-batch; 2p sets of half a
// stage's blocks on every stage, 1F1B's stage 0 peak; checkpointing refused.
TEST(Planner, ZeroBubbleVIdlesLessThanZeroBubbleH1InOneFOneBsPeak) {
  Job j = job_of("gpt2-350m", 32, 128);
  j.model.vocab_size = 16;
  Layout one = Layout::of(1, 1, 4, 1, 0, 4, 8), zb = one, zv = one;
  zb.pp_schedule = parallel::PipeSchedule::zero_bubble_h1;
  zv.pp_schedule = parallel::PipeSchedule::zero_bubble_v;
  zv.virtual_stages = 2;
  const Prediction a = predict(j, small_cluster(), one), b = predict(j, small_cluster(), zb),
                   c = predict(j, small_cluster(), zv);
  ASSERT_TRUE(a.why_not.empty() && b.why_not.empty() && c.why_not.empty()) << a.why_not << b.why_not << c.why_not;
  EXPECT_EQ(c.layout.describe(), "dp1 tp1 pp4 z0 mb4x8 zbv");
  EXPECT_GT(c.time.bubble, 0);
  EXPECT_LT(c.time.bubble, 0.6 * b.time.bubble);
  EXPECT_NEAR(c.time.pp_p2p, 2 * a.time.pp_p2p, 1e-9 * a.time.step);
  EXPECT_DOUBLE_EQ(c.stage_memory[0].activations, a.stage_memory[0].activations);
  Layout ckpt = zv;
  ckpt.checkpoint = 1;
  EXPECT_NE(check_layout(j, small_cluster(), ckpt).find("zbv with activation checkpointing"), std::string::npos);
}

// parallel.offload: auto takes the stage that holds the embedding and the head (tied GPT-2 with
// its 50257-word table on both ends of pp=4: the first and last stages), whose Adam moments leave
// the device for two staging buffers; a listed stage goes whatever its size; the optimizer's time
// becomes the copies' where they are the slower stream.
TEST(Planner, OffloadedMomentsLeaveTheStagesThatNeedMost) {
  const Job j = job_of("gpt2-124m", 8, 128);
  Layout l = Layout::of(1, 1, 4, 1, 0, 1, 8);
  const Prediction resident = predict(j, small_cluster(), l);
  l.offload = optim::OffloadTarget::disk;
  const Prediction off = predict(j, small_cluster(), l);
  ASSERT_EQ(off.stage_memory.size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    const MemoryPrediction &a = resident.stage_memory[s], &b = off.stage_memory[s];
    const bool ends = s == 0 || s == 3;
    EXPECT_EQ(b.offloaded, ends ? a.optimizer : 0.0) << "stage " << s;
    if (ends) {
      EXPECT_GT(b.optimizer, 0);
      EXPECT_LT(b.optimizer, 0.2 * a.optimizer) << "stage " << s << ": two units' moments stay";
      EXPECT_NEAR(b.total(), a.total() - a.optimizer + b.optimizer, 1);
    } else {
      EXPECT_EQ(b.total(), a.total());
    }
  }
  EXPECT_LT(off.memory.total(), resident.memory.total());
  EXPECT_GE(off.time.optimizer, resident.time.optimizer);
  Cluster slow = small_cluster();
  slow.device.offload_bytes_per_s = 1e8;  // 0.1 GB/s: the copies take longer than the update
  const Prediction slow_off = predict(j, slow, l);
  EXPECT_NEAR(slow_off.time.optimizer, 2 * slow_off.stage_memory[0].offloaded / 1e8, 1e-9);
  l.offload_stages = {1};
  const Prediction listed = predict(j, small_cluster(), l);
  EXPECT_EQ(listed.stage_memory[0].offloaded, 0.0);
  EXPECT_EQ(listed.stage_memory[1].offloaded, resident.stage_memory[1].optimizer);
}

TEST(Planner, OverlapHidesGradientReductionBehindBackward) {
  const Job j = job_of("gpt2-124m", 4, 128);
  Cluster c = small_cluster();
  Layout l = Layout::of(4, 1, 1, 1, 0, 1, 1);
  c.overlap_fraction = 0;
  const Prediction none = predict(j, c, l);
  EXPECT_NEAR(none.time.dp_exposed, none.time.dp_comm, 1e-12);
  c.overlap_fraction = 1;
  const Prediction all = predict(j, c, l);
  EXPECT_LT(all.time.dp_exposed, 0.5 * all.time.dp_comm);
  EXPECT_GT(all.time.dp_exposed, 0) << "the last bucket cannot overlap";
  EXPECT_LT(all.time.step, none.time.step);
}

TEST(Planner, CrossNodeCollectivesCostMore) {
  const Job j = job_of("gpt2-124m", 8, 128);
  Job two = j;
  two.nodes = 2;
  Layout l = Layout::of(8, 1, 1, 1, 0, 1, 1);
  const Prediction one_node = predict(j, small_cluster(8), l);
  const Prediction two_nodes = predict(two, small_cluster(4), l);
  EXPECT_GT(two_nodes.time.dp_comm, 2 * one_node.time.dp_comm);
}

TEST(Planner, ExpertParallelismPaysAllToAllsAndReducesDenseGradientsOverDpTimesEp) {
  const Job j = job_of("llama-moe-60m", 8, 512);
  const Prediction one = predict(j, small_cluster(8), Layout::of(8, 1, 1, 1, 0, 1, 1));
  const Prediction ep = predict(j, small_cluster(8), Layout::of(1, 1, 1, 8, 0, 1, 1));
  ASSERT_TRUE(one.why_not.empty() && ep.why_not.empty()) << one.why_not << ep.why_not;
  EXPECT_EQ(one.time.ep_a2a, 0);
  EXPECT_GT(ep.time.ep_a2a, 0);
  // dp=1 x ep=8: the dense parameters still reduce over all 8 ranks.
  EXPECT_GT(ep.time.dp_comm, 0);
  // Each rank holds 1 of 8 experts: fewer parameters than every rank holding all 8.
  EXPECT_LT(ep.memory.params, one.memory.params);
  const std::string e = explain(j, small_cluster(8), ep);
  EXPECT_NE(e.find("expert all-to-all"), std::string::npos) << e;
}

TEST(Planner, InvalidLayoutsAreRefusedWithTheReason) {
  const Job j = job_of("gpt2-shakespeare", 8, 128);  // 6 heads, 4 layers
  EXPECT_EQ(check_layout(j, small_cluster(), Layout::of(1, 4, 1, 1, 0, 8, 1)), "tp=4 does not divide n_head=6");
  EXPECT_EQ(check_layout(j, small_cluster(), Layout::of(1, 1, 8, 1, 0, 8, 1)), "pp=8 exceeds n_layer=4");
  EXPECT_NE(check_layout(j, small_cluster(), Layout::of(2, 1, 1, 1, 0, 8, 1)).find("is not the global batch 8"),
            std::string::npos);
  EXPECT_EQ(check_layout(j, small_cluster(2), Layout::of(1, 3, 1, 1, 0, 8, 1)), "tp=3 spans nodes (2 devices each)");
}

TEST(Planner, SearchRanksFittingLayoutsByStepTime) {
  const Job j = job_of("gpt2-124m", 16, 256);
  const auto ranked = search(j, small_cluster(4));
  ASSERT_GT(ranked.size(), 10u);
  bool seen_unfit = false;
  for (size_t i = 0; i < ranked.size(); ++i) {
    EXPECT_TRUE(check_layout(j, small_cluster(4), ranked[i].layout).empty());
    EXPECT_EQ(ranked[i].layout.ranks(), 4);
    if (!ranked[i].fits) seen_unfit = true;
    EXPECT_FALSE(seen_unfit && ranked[i].fits) << "a fitting layout after one that does not fit";
    if (i > 0 && ranked[i].fits) {
      EXPECT_LE(ranked[i - 1].time.step, ranked[i].time.step);
    }
  }
  // 1 GiB per device: gpt2-124m's 2 GB of fp32 Adam states fit only sharded (ZeRO-3 over 4).
  Cluster tight = small_cluster(4);
  tight.device.memory_bytes = 1.0 * 1024 * 1024 * 1024;
  for (const auto& p : search(j, tight))
    if (p.fits) {
      EXPECT_TRUE(p.layout.zero_stage == 3 || p.layout.pp > 1 || p.layout.tp > 1) << p.layout.describe();
    }
  tight.device.memory_bytes = 64.0 * 1024 * 1024;
  const auto none = search(j, tight);
  ASSERT_FALSE(none.empty());
  EXPECT_FALSE(none.front().fits);
  EXPECT_NE(none.front().why_not.find("needs"), std::string::npos) << none.front().why_not;
}

TEST(Planner, ExplainNamesEveryTerm) {
  Job j = job_of("gpt2-124m", 16, 256);
  const Prediction p = predict(j, small_cluster(4), Layout::of(2, 1, 2, 1, 1, 2, 4, 1));
  const std::string e = explain(j, small_cluster(4), p);
  for (const char* term : {"matrix products", "attention", "elementwise", "recomputation", "pipeline bubble",
                           "data-parallel exposed", "optimizer", "memory on stage"})
    EXPECT_NE(e.find(term), std::string::npos) << term << " missing from\n" << e;
}

// parallel.offload.params at ZeRO-3 (dp=4, no pipeline, the one stage listed): the parameter
// shards leave the device but for three chunks of the widest unit (in use, gathering, being
// read: an eighth of 24 blocks); the optimizer's stream grows by the shards' read and write, and with a slow stream the
// reads for every gather (forward and backward of each micro-batch) outrun the compute and wait.
// Below ZeRO-3 the layout is refused.
TEST(Planner, OffloadedParameterShardsLeaveZeroThreeRanks) {
  Job j = job_of("gpt2-350m", 8, 128);
  j.model.vocab_size = 16;  // 24 equal block units
  Layout l = Layout::of(4, 1, 1, 1, 3, 1, 2);
  l.offload_stages = {0};
  const Prediction resident = predict(j, small_cluster(), l);
  l.offload_params = optim::OffloadTarget::disk;
  const Prediction off = predict(j, small_cluster(), l);
  ASSERT_TRUE(resident.why_not.empty() && off.why_not.empty()) << resident.why_not << off.why_not;
  const MemoryPrediction &a = resident.stage_memory[0], &b = off.stage_memory[0];
  EXPECT_GT(b.params, 0);
  EXPECT_NEAR(b.params, a.params / 8, 0.01 * a.params);
  EXPECT_NEAR(b.offloaded, a.params - b.params, 1);
  EXPECT_NEAR(b.total(), a.total() - b.offloaded, 1);
  EXPECT_GE(off.time.optimizer, resident.time.optimizer);
  Cluster slow = small_cluster();
  slow.device.offload_bytes_per_s = 1e7;
  const Prediction slow_off = predict(j, slow, l);
  EXPECT_NEAR(slow_off.time.optimizer, 2 * b.offloaded / 1e7, 1e-6 * slow_off.time.optimizer);
  EXPECT_GT(slow_off.time.dp_exposed, off.time.dp_exposed);
  l.zero_stage = 1;
  EXPECT_NE(check_layout(j, small_cluster(), l).find("offload_params with ZeRO-1"), std::string::npos);
}

}  // namespace
}  // namespace loom::plan
