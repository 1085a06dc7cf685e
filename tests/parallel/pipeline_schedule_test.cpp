// Pipeline schedules as pure data: every micro-batch's forward precedes its backward on every
// stage, schedules execute without deadlock, 1F1B bounds the micro-batches in flight, and the
// replayed bubble of equal stages is (p - 1) / (m + p - 1).
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/parallel/pipeline_schedule.h"

using namespace loom;
using namespace loom::parallel;
using K = PipeAction::Kind;

namespace {
std::string show(const StageActions& st) {
  std::string s;
  for (const auto& a : st) s += str_cat(a.kind == K::forward ? "F" : "B", a.micro, " ");
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
  EXPECT_THROW(pipe_schedule_from_name("zb"), Error);
  EXPECT_THROW(gpipe_schedule(2, 0), Error);
}
