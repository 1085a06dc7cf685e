// Pipeline schedules as data (ARCHITECTURE.md, invariant 5): for p stages and m micro-batches,
// each stage's ordered list of forward/backward actions. No communication here: the executor
// (pipeline.h) derives the sends and receives, and the tests check the lists directly. Also a
// dependency-driven simulator that replays a schedule with given action times (bubble figures).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::parallel {

enum class PipeSchedule { gpipe, one_f_one_b };
// "gpipe" or "1f1b"; throws "[config] parallel.pp_schedule: ..." otherwise.
PipeSchedule pipe_schedule_from_name(const std::string& name);
const char* pipe_schedule_name(PipeSchedule s);

struct PipeAction {
  enum class Kind : uint8_t { forward, backward };
  Kind kind;
  int micro;
  bool operator==(const PipeAction& o) const { return kind == o.kind && micro == o.micro; }
};
using StageActions = std::vector<PipeAction>;

// GPipe (Huang et al. 2019): all forwards, then all backwards in the same micro-batch order.
std::vector<StageActions> gpipe_schedule(int stages, int micro_batches);
// 1F1B, non-interleaved (Narayanan et al. 2021, PipeDream-Flush): stage s runs
// min(p - s - 1, m) warm-up forwards, then alternates one forward and one backward, then
// drains the remaining backwards; at most p - s micro-batches are in flight on stage s.
std::vector<StageActions> one_f_one_b_schedule(int stages, int micro_batches);
std::vector<StageActions> make_schedule(PipeSchedule kind, int stages, int micro_batches);

// "" when every stage runs each micro-batch's forward once, then its backward once, and the
// whole schedule can execute (no stage waits for an action that can never run); otherwise
// what is wrong.
std::string check_schedule(const std::vector<StageActions>& schedule, int micro_batches);
// Largest number of micro-batches whose forward has run and backward has not, on one stage:
// how many activation sets the stage keeps at once.
int max_in_flight(const StageActions& actions);

// Replays a schedule as soon as dependencies allow: F(s, i) after F(s-1, i); B(s, i) after
// B(s+1, i), and the last stage's B(i) after its F(i); each stage runs its actions in order.
// Communication is free. Times are per action of each stage (forward_time[s], backward_time[s]).
struct Timeline {
  double makespan = 0;
  std::vector<double> busy;                   // per stage: seconds computing
  std::vector<double> idle_fraction() const;  // (makespan - busy) / makespan per stage
  // Start time of every action, per stage, in schedule order.
  std::vector<std::vector<double>> start;
};
Timeline simulate_schedule(const std::vector<StageActions>& schedule, const std::vector<double>& forward_time,
                           const std::vector<double>& backward_time);

// The idle fraction of GPipe and 1F1B with equal stages: (p - 1) / (m + p - 1).
double bubble_fraction(int stages, int micro_batches);

}  // namespace loom::parallel
