// Pipeline schedules as pure data: every micro-batch's forward precedes its backward on every
// stage, schedules execute without deadlock, 1F1B bounds the micro-batches in flight, and the
// replayed bubble of equal stages is (p - 1) / (m + p - 1), or (p - 1) / (v m + p - 1) for
// interleaved 1F1B with v chunks per stage; ZB-H1 keeps 1F1B's peak of micro-batches in flight
// and idles a third of 1F1B's time.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/parallel/pipeline_schedule.h"

using namespace loom;
using namespace loom::parallel;
using K = PipeAction::Kind;

namespace {
std::string show(const StageActions& st) {
  std::string s;
  for (const auto& a : st)
    s += str_cat(a.kind == K::forward    ? "F"
                 : a.kind == K::backward ? "B"
                                         : "W",
                 a.micro, a.chunk ? str_cat(".", a.chunk) : "", " ");
  return s;
}
}  // namespace

TEST(PipelineSchedule, OneFOneBOrderForTwoStages) {
  auto s = one_f_one_b_schedule(2, 3);
  EXPECT_EQ(show(s[0]), "F0 F1 B0 F2 B1 B2 ");
  EXPECT_EQ(show(s[1]), "F0 B0 F1 B1 F2 B2 ");
  auto g = gpipe_schedule(2, 3);
  EXPECT_EQ(show(g[0]), "F0 F1 F2 B0 B1 B2 ");
  EXPECT_EQ(show(g[1]), show(g[0]));
  // Four stages, eight micro-batches: three warm-up forwards on stage 0.
  EXPECT_EQ(show(one_f_one_b_schedule(4, 8)[0]), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 ");
}

TEST(PipelineSchedule, EveryForwardPrecedesItsBackwardAndSchedulesExecute) {
  for (auto kind : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 10; ++m) {
        const auto sched = make_schedule(kind, p, m);
        ASSERT_EQ(int(sched.size()), p);
        EXPECT_EQ(check_schedule(sched, m), "") << pipe_schedule_name(kind) << " p=" << p << " m=" << m;
        for (int s = 0; s < p; ++s) {
          const auto& st = sched[size_t(s)];
          ASSERT_EQ(int(st.size()), 2 * m);
          std::vector<int> seen_f(size_t(m), -1);
          for (int i = 0; i < int(st.size()); ++i) {
            if (st[size_t(i)].kind == K::forward)
              seen_f[size_t(st[size_t(i)].micro)] = i;
            else
              EXPECT_GE(seen_f[size_t(st[size_t(i)].micro)], 0) << "stage " << s << ": " << show(st);
          }
          // Micro-batches enter and leave each stage in order (the executor relies on it).
          int nf = 0, nb = 0;
          for (const auto& a : st) EXPECT_EQ(a.micro, a.kind == K::forward ? nf++ : nb++);
        }
      }
}

TEST(PipelineSchedule, OneFOneBBoundsMicroBatchesInFlight) {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 12; ++m) {
      const auto f = one_f_one_b_schedule(p, m), g = gpipe_schedule(p, m);
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(max_in_flight(f[size_t(s)]), std::min(p - s, m)) << "1f1b p=" << p << " m=" << m << " s=" << s;
        EXPECT_EQ(max_in_flight(g[size_t(s)]), m);
      }
      EXPECT_LE(max_in_flight(f[0]), p);
    }
}

TEST(PipelineSchedule, EqualStagesGiveTheTextbookBubble) {
  for (auto kind : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 4, 7, 16}) {
        const int stages = p;
        Timeline t = simulate_schedule(make_schedule(kind, p, m), std::vector<double>(size_t(stages), 1.0),
                                       std::vector<double>(size_t(stages), 2.0));
        EXPECT_DOUBLE_EQ(t.makespan, 3.0 * (m + p - 1)) << pipe_schedule_name(kind) << " p=" << p << " m=" << m;
        for (double idle : t.idle_fraction()) EXPECT_NEAR(idle, bubble_fraction(p, m), 1e-12);
      }
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8), 3.0 / 11.0);
}

TEST(PipelineSchedule, TransfersDelayOnlyWhatCrossesStages) {
  // One micro-batch goes down p stages and comes back: 2 (p - 1) transfers on its path.
  const double L = 0.25;
  for (auto kind : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    for (int p : {2, 3, 4}) {
      const auto one = std::vector<double>(size_t(p), 1.0), two = std::vector<double>(size_t(p), 2.0);
      Timeline t = simulate_schedule(make_schedule(kind, p, 1), one, two, {}, ChunkPlacement::loop, L);
      EXPECT_DOUBLE_EQ(t.makespan, 3.0 * p + 2.0 * (p - 1) * L) << pipe_schedule_name(kind) << " p=" << p;
    }
  // ZB-V at p = 2: down, turn, back up, and the same backwards: four transfers, while the turn's
  // two hand-overs stay on the last stage and cost nothing.
  const auto z = zero_bubble_v_schedule(2, 1);
  const std::vector<double> one = {1.0, 1.0};
  const Timeline free = simulate_schedule(z, one, one, one, ChunkPlacement::vee);
  const Timeline paid = simulate_schedule(z, one, one, one, ChunkPlacement::vee, L);
  EXPECT_DOUBLE_EQ(paid.makespan - free.makespan, 4 * L);
  EXPECT_THROW(simulate_schedule(z, one, one, one, ChunkPlacement::vee, -1.0), Error);
}

TEST(PipelineSchedule, ASlowStageStretchesEveryStage) {
  // Stage 1 twice as slow: the makespan follows the slowest stage, the others idle more.
  Timeline t = simulate_schedule(one_f_one_b_schedule(3, 6), {1, 2, 1}, {2, 4, 2});
  EXPECT_GT(t.makespan, 3.0 * (6 + 3 - 1));
  EXPECT_LT(t.idle_fraction()[1], t.idle_fraction()[0]);
}

TEST(PipelineSchedule, CheckFindsBrokenSchedules) {
  std::vector<StageActions> backward_first = {{{K::backward, 0}, {K::forward, 0}}};
  EXPECT_NE(check_schedule(backward_first, 1).find("before its forward"), std::string::npos);
  std::vector<StageActions> missing = {{{K::forward, 0}, {K::backward, 0}}};
  EXPECT_NE(check_schedule(missing, 2).find("never runs the forward of micro-batch 1"), std::string::npos);
  // Stage 0 waits for B0 from stage 1, which first wants F1 that stage 0 has not sent.
  std::vector<StageActions> deadlock = {{{K::forward, 0}, {K::backward, 0}, {K::forward, 1}, {K::backward, 1}},
                                        {{K::forward, 1}, {K::backward, 1}, {K::forward, 0}, {K::backward, 0}}};
  EXPECT_NE(check_schedule(deadlock, 2).find("deadlock"), std::string::npos);
  // Two stages of two chunks, one micro-batch: the ring order executes; stage 0 starting with
  // chunk 1, which needs stage 1's chunk 0, which needs stage 0's chunk 0, deadlocks.
  std::vector<StageActions> early_chunk = {
      {{K::forward, 0, 0}, {K::forward, 0, 1}, {K::backward, 0, 1}, {K::backward, 0, 0}},
      {{K::forward, 0, 0}, {K::forward, 0, 1}, {K::backward, 0, 1}, {K::backward, 0, 0}}};
  EXPECT_EQ(check_schedule(early_chunk, 1), "");
  std::vector<StageActions> chunk_deadlock = {
      {{K::forward, 0, 1}, {K::forward, 0, 0}, {K::backward, 0, 1}, {K::backward, 0, 0}},
      {{K::forward, 0, 0}, {K::forward, 0, 1}, {K::backward, 0, 1}, {K::backward, 0, 0}}};
  EXPECT_NE(check_schedule(chunk_deadlock, 1).find("deadlock"), std::string::npos);
  std::vector<StageActions> missing_chunk = {{{K::forward, 0, 0}, {K::backward, 0, 0}, {K::forward, 0, 1}}};
  EXPECT_NE(check_schedule(missing_chunk, 1).find("never runs the backward of micro-batch 0 in chunk 1"),
            std::string::npos);
  EXPECT_THROW(pipe_schedule_from_name("zb"), Error);
  EXPECT_THROW(gpipe_schedule(2, 0), Error);
}

TEST(PipelineSchedule, InterleavedOrderForTwoStages) {
  // Megatron's order: micro-batches in groups of p per chunk; stage 0 warms up with
  // 2 (p - 1) + (v - 1) p = 4 forwards, the last stage with (v - 1) p = 2.
  const auto s = interleaved_schedule(2, 4, 2);
  EXPECT_EQ(show(s[0]), "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3 ");
  EXPECT_EQ(show(s[1]), "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3 ");
  EXPECT_EQ(interleaved_schedule(3, 6, 1), one_f_one_b_schedule(3, 6));
  EXPECT_EQ(make_schedule(PipeSchedule::one_f_one_b, 2, 4, 2), s);
  EXPECT_EQ(schedule_chunks(s), 2);
  EXPECT_THROW(interleaved_schedule(2, 3, 2), Error);  // m not a multiple of p
  EXPECT_THROW(make_schedule(PipeSchedule::gpipe, 2, 4, 2), Error);
}

TEST(PipelineSchedule, InterleavedExecutesInOrderPerChunkWithItsInFlightBound) {
  for (int p = 1; p <= 5; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 4 * p; m += p) {
        const auto sched = interleaved_schedule(p, m, v);
        const std::string what = str_cat("p=", p, " m=", m, " v=", v);
        ASSERT_EQ(check_schedule(sched, m), "") << what;
        for (int s = 0; s < p; ++s) {
          const auto& st = sched[size_t(s)];
          ASSERT_EQ(int(st.size()), 2 * m * v) << what;
          // Within each chunk micro-batches enter and leave in order (the executor's transfers
          // are matched by (micro-batch, chunk) tags, the decoder's dropout keys by that order).
          std::vector<int> nf(size_t(v), 0), nb(size_t(v), 0);
          for (const auto& a : st)
            EXPECT_EQ(a.micro, a.kind == K::forward ? nf[size_t(a.chunk)]++ : nb[size_t(a.chunk)]++) << what;
          // Warm-up forwards plus the first steady one; at most all m v.
          EXPECT_EQ(max_in_flight(st), std::min(2 * (p - s - 1) + (v - 1) * p + 1, m * v)) << what << " s=" << s;
          // A micro-batch's last backward on a stage is its chunk 0's (the decoder then hands
          // over the embeddings' and head's gradients).
          EXPECT_EQ(st.back(), (PipeAction{K::backward, m - 1, 0})) << what;
        }
      }
}

TEST(PipelineSchedule, InterleavedBubbleIsTheFormulaByConstruction) {
  // Per action one chunk's work: 1/v of a stage's forward and backward.
  for (int p : {2, 3, 4, 8})
    for (int v : {2, 3, 4})
      for (int k : {1, 2, 4}) {
        const int m = k * p;
        const std::vector<double> tf(size_t(p), 1.0 / v), tb(size_t(p), 2.0 / v);
        Timeline t = simulate_schedule(interleaved_schedule(p, m, v), tf, tb);
        const std::string what = str_cat("p=", p, " m=", m, " v=", v);
        EXPECT_NEAR(t.makespan, 3.0 * (m + double(p - 1) / v), 1e-9) << what;
        for (double idle : t.idle_fraction()) EXPECT_NEAR(idle, bubble_fraction(p, m, v), 1e-12) << what;
        // Against 1F1B at the same m: (v m + p - 1) / (m + p - 1) less bubble, 1.3x or more
        // whenever v >= 2 and m <= 4 p.
        EXPECT_GE(bubble_fraction(p, m) / bubble_fraction(p, m, v), 1.3) << what;
      }
  EXPECT_DOUBLE_EQ(bubble_fraction(2, 4, 2), 1.0 / 9.0);
}

TEST(PipelineSchedule, VirtualStagesRefusedWithTheKeyAndTheFix) {
  auto message = [](PipeSchedule k, int p, int m, int v, int L) -> std::string {
    try {
      check_virtual_stages(k, p, m, v, L);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(PipeSchedule::one_f_one_b, 2, 4, 2, 8), "");
  EXPECT_EQ(message(PipeSchedule::gpipe, 2, 3, 1, 3), "");
  EXPECT_NE(message(PipeSchedule::one_f_one_b, 2, 4, 3, 8)
                .find("[config] parallel.virtual_stages=3 needs model.n_layer divisible by parallel.pp x "
                      "parallel.virtual_stages = 6"),
            std::string::npos);
  EXPECT_NE(message(PipeSchedule::one_f_one_b, 2, 3, 2, 8).find("use parallel.micro_batches=4"), std::string::npos);
  EXPECT_NE(message(PipeSchedule::gpipe, 2, 4, 2, 8).find("set parallel.pp_schedule=1f1b"), std::string::npos);
  EXPECT_NE(message(PipeSchedule::one_f_one_b, 1, 4, 2, 8).find("needs a pipeline"), std::string::npos);
}

TEST(PipelineSchedule, ZeroBubbleH1DefersWeightPassesByTheStageIndex) {
  const auto z = zero_bubble_h1_schedule(2, 4);
  EXPECT_EQ(show(z[0]), "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3 ");
  EXPECT_EQ(show(z[1]), "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3 ");
  EXPECT_EQ(make_schedule(PipeSchedule::zero_bubble_h1, 2, 4), z);
  EXPECT_TRUE(splits_backward(z));
  EXPECT_FALSE(splits_backward(one_f_one_b_schedule(2, 4)));
  EXPECT_EQ(pipe_schedule_from_name("zb1p"), PipeSchedule::zero_bubble_h1);
  EXPECT_STREQ(pipe_schedule_name(PipeSchedule::zero_bubble_h1), "zb1p");
  std::vector<StageActions> weight_first = {{{K::forward, 0}, {K::weight, 0}, {K::backward, 0}}};
  EXPECT_NE(check_schedule(weight_first, 1).find("weight pass of 0 before its backward"), std::string::npos);
  std::vector<StageActions> no_weight = {
      {{K::forward, 0}, {K::backward, 0}, {K::weight, 0}, {K::forward, 1}, {K::backward, 1}}};
  EXPECT_NE(check_schedule(no_weight, 2).find("never runs the weight pass of micro-batch 1"), std::string::npos);
}

TEST(PipelineSchedule, ZeroBubbleH1KeepsOneFOneBsPeakAndAThirdOfItsBubble) {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 4 * p; ++m) {
      const auto z = zero_bubble_h1_schedule(p, m), f = one_f_one_b_schedule(p, m);
      const std::string what = str_cat("p=", p, " m=", m);
      ASSERT_EQ(check_schedule(z, m), "") << what;
      for (int s = 0; s < p; ++s) {
        // Between forward and weight pass: never more than 1F1B's stage 0 keeps.
        EXPECT_LE(max_in_flight(z[size_t(s)]), max_in_flight(f[0])) << what << " s=" << s;
        // Without the weight passes it is 1F1B.
        StageActions fb;
        for (const auto& a : z[size_t(s)])
          if (a.kind != K::weight) fb.push_back(a);
        EXPECT_EQ(fb, f[size_t(s)]) << what;
      }
      // Equal F, B and W: 1F1B's backward is B + W. Idle per stage (p - 1) passes against
      // 1F1B's 3 (p - 1), once every stage has work in its drain to fill it (m >= p).
      const std::vector<double> one(size_t(p), 1.0), two(size_t(p), 2.0);
      const Timeline tz = simulate_schedule(z, one, one, one), tf = simulate_schedule(f, one, two);
      if (m < p) continue;
      EXPECT_NEAR(tz.makespan, 3.0 * m + (p - 1), 1e-9) << what;
      for (size_t s = 0; s < size_t(p); ++s) {
        EXPECT_NEAR(tz.makespan - tz.busy[s], (tf.makespan - tf.busy[s]) / 3, 1e-9) << what;
        EXPECT_NEAR(tz.idle_fraction()[s], zero_bubble_h1_fraction(p, m), 1e-12) << what;
      }
    }
  EXPECT_DOUBLE_EQ(predicted_bubble(PipeSchedule::zero_bubble_h1, 2, 4), 1.0 / 13.0);
  EXPECT_DOUBLE_EQ(predicted_bubble(PipeSchedule::one_f_one_b, 2, 4, 2), 1.0 / 9.0);
  EXPECT_THROW(simulate_schedule(zero_bubble_h1_schedule(2, 2), {1, 1}, {1, 1}), Error);  // no weight times
}

TEST(PipelineSchedule, VeePlacementTurnsAtTheLastStageAndEndsOnTheFirst) {
  const ChunkPlacement vee = ChunkPlacement::vee, loop = ChunkPlacement::loop;
  EXPECT_EQ(chunk_placement(PipeSchedule::zero_bubble_v), vee);
  EXPECT_EQ(chunk_placement(PipeSchedule::zero_bubble_h1), loop);
  EXPECT_EQ(schedule_chunk_count(PipeSchedule::zero_bubble_v, 1), 2);
  EXPECT_EQ(schedule_chunk_count(PipeSchedule::one_f_one_b, 3), 3);
  // p = 3: stage 0 holds model chunks 0 and 5, stage 1 chunks 1 and 4, stage 2 chunks 2 and 3.
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(model_chunk(s, 0, 3, 2, vee), s);
    EXPECT_EQ(model_chunk(s, 1, 3, 2, vee), 5 - s);
  }
  EXPECT_FALSE(chunk_input_from(0, 0, 3, 2, vee).valid());  // the embeddings
  EXPECT_FALSE(chunk_output_to(0, 1, 3, 2, vee).valid());   // the head
  const ChunkAt turn = chunk_input_from(2, 1, 3, 2, vee), back = chunk_output_to(1, 1, 3, 2, vee);
  EXPECT_EQ(turn.stage, 2);  // the last stage feeds its own chunk 1
  EXPECT_EQ(turn.chunk, 0);
  EXPECT_EQ(back.stage, 0);  // chunk 1 runs up the stages
  EXPECT_EQ(back.chunk, 1);
  // The loop: the last stage's chunk c feeds the first stage's chunk c + 1.
  const ChunkAt ring = chunk_output_to(2, 0, 3, 2, loop);
  EXPECT_EQ(ring.stage, 0);
  EXPECT_EQ(ring.chunk, 1);
  EXPECT_FALSE(chunk_output_to(2, 1, 3, 2, loop).valid());
  EXPECT_EQ(pipe_schedule_from_name("zbv"), PipeSchedule::zero_bubble_v);
  EXPECT_STREQ(pipe_schedule_name(PipeSchedule::zero_bubble_v), "zbv");
  // An order the V's dependencies cannot run: the last stage's chunk 1 before its chunk 0.
  std::vector<StageActions> wrong = zero_bubble_v_schedule(2, 1);
  StageActions& last = wrong[1];
  std::swap(*std::find(last.begin(), last.end(), PipeAction{K::forward, 0, 0}),
            *std::find(last.begin(), last.end(), PipeAction{K::forward, 0, 1}));
  EXPECT_NE(check_schedule(wrong, 1, vee), "");
}

TEST(PipelineSchedule, ZeroBubbleVKeepsOneFOneBsPeakWithLessThanAThirdOfItsBubble) {
  for (int p = 2; p <= 5; ++p)
    for (int m = 1; m <= 4 * p; ++m) {
      const auto z = zero_bubble_v_schedule(p, m);
      const std::string what = str_cat("p=", p, " m=", m);
      ASSERT_EQ(check_schedule(z, m, ChunkPlacement::vee), "") << what;
      ASSERT_TRUE(splits_backward(z));
      EXPECT_EQ(schedule_chunks(z), 2);
      // 1F1B's peak is p sets of a stage's blocks on stage 0: 2p of half a stage.
      // Stage 0, which holds the head's buffers too, one set fewer where that costs no idle time
      // (with two stages: every even m).
      for (int s = 0; s < p; ++s) EXPECT_LE(max_in_flight(z[size_t(s)]), std::min(2 * p, 2 * m)) << what;
      if (p == 2 && m % 2 == 0) {
        EXPECT_EQ(max_in_flight(z[0]), 3) << what;
      }
      if (m < 2 * p) continue;
      // Against 1F1B's idle (p - 1)(T_F + T_B + T_W) per stage, with equal chunk passes and with
      // input-gradient passes heavier than weight passes (this CPU's 32 : 36 : 28, section
      // "Pipeline schedules" of PERFORMANCE.md): at most 0.3 (a sixth up to p = 4), and a third.
      for (const auto& [t, bound] :
           std::vector<std::pair<std::array<double, 3>, double>>{{{1, 1, 1}, 0.3}, {{32, 36, 28}, 1.0 / 3}}) {
        const Timeline tl =
            simulate_schedule(z, std::vector<double>(size_t(p), t[0]), std::vector<double>(size_t(p), t[1]),
                              std::vector<double>(size_t(p), t[2]), ChunkPlacement::vee);
        const double one_f_one_b = (p - 1) * 2 * (t[0] + t[1] + t[2]);
        for (size_t s = 0; s < size_t(p); ++s)
          EXPECT_LE(tl.makespan - tl.busy[s], bound * one_f_one_b) << what << " passes " << t[0] << ":" << t[1];
      }
    }
  EXPECT_EQ(make_schedule(PipeSchedule::zero_bubble_v, 2, 4, 2), zero_bubble_v_schedule(2, 4));
  EXPECT_NEAR(predicted_bubble(PipeSchedule::zero_bubble_v, 2, 4), zero_bubble_v_fraction(2, 4), 0);
  EXPECT_LT(zero_bubble_v_fraction(2, 4), zero_bubble_h1_fraction(2, 4));
  EXPECT_THROW(zero_bubble_v_schedule(1, 4), Error);
  auto message = [](int p, int m, int v, int L) {
    try {
      check_virtual_stages(PipeSchedule::zero_bubble_v, p, m, v, L);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message(2, 3, 2, 4), "");  // any m
  EXPECT_EQ(message(1, 3, 1, 4), "");  // no pipeline: nothing placed
  EXPECT_NE(message(2, 4, 3, 12).find("places 2 chunks of blocks on each stage"), std::string::npos);
  EXPECT_NE(message(2, 4, 2, 6).find("divisible by 2 x parallel.pp = 4"), std::string::npos);
}
