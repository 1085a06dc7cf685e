// parallel.micro_batches: auto. Chooses how many micro-batches a step splits each rank's batch
// into, from measured step times, keeping the global batch (the same rows in the same order,
// only grouped differently). More micro-batches shrink a pipeline's bubble, (p-1)/(m+p-1) of the
// step under 1F1B, and each micro-batch's activations; fewer, larger ones cut what every
// micro-batch pays whatever its size (a transfer's latency, a kernel's start, a small GEMM's
// lower rate). Which wins depends on the model, the layout and the machine, so the tuner measures:
// it times the starting m, steps to the neighbouring candidate in the direction the measured
// bubble points to (more micro-batches when the bubble is a noticeable part of the step, fewer
// otherwise), keeps going while the step gets faster, tries the other side when the first move
// does not help, and settles on the fastest m it measured. Pure: times in, decisions out (the
// trainer feeds it times that are the same on every rank, so every rank decides the same).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace loom::train {

class MicroBatchTuner {
 public:
  // A bubble below this fraction of the step is not worth more micro-batches: the first move
  // goes to fewer.
  static constexpr double kBubbleWorth = 0.05;
  // A neighbour must be this much faster than where the tuner came from to count as better
  // (shared machines are noisy).
  static constexpr double kMinGain = 0.02;

  // candidates: the allowed micro-batch counts (divisors of the per-rank batch that the schedule
  // takes and whose activations fit), any order; start: one of them. Each candidate is timed
  // over `samples` steps (the median) after `settle` steps that are not counted (the first step
  // after a change allocates the new shapes).
  MicroBatchTuner(std::vector<int64_t> candidates, int64_t start, int samples = 3, int settle = 1);

  struct Change {
    int64_t m = 0;
    std::string reason;  // why, with the measured figures
  };
  // After a step run with current() micro-batches: its wall time and the largest idle time of a
  // pipeline stage in it (0 without a pipeline). Returns the micro-batch count for the next
  // step when it changes.
  std::optional<Change> observe(double step_s, double bubble_s);

  int64_t current() const { return cand_[cur_]; }
  bool settled() const { return settled_; }

 private:
  std::optional<Change> move_to(size_t to, std::string reason);
  std::optional<Change> settle(std::string why);
  double median_time(size_t i) const;  // candidate i's median step; 0 before its samples are in

  std::vector<int64_t> cand_;
  size_t cur_ = 0, start_ = 0;
  int samples_, settle_, skip_;
  std::map<size_t, std::vector<double>> times_, bubbles_;
  int dir_ = 0;          // +1: towards more micro-batches, -1: fewer; 0 before the first move
  bool turned_ = false;  // the other direction was tried after a first move that did not help
  bool settled_ = false;
};

}  // namespace loom::train
