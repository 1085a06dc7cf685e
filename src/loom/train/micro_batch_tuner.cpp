#include "loom/train/micro_batch_tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loom/core/error.h"
#include "loom/core/stats.h"

namespace loom::train {

namespace {
// "1012 ms", "7.3 ms": enough digits to tell neighbouring counts apart.
std::string ms(double s) {
  const double v = s * 1e3;
  if (v >= 100) return str_cat(std::llround(v), " ms");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", v);
  return buf;
}
}  // namespace

MicroBatchTuner::MicroBatchTuner(std::vector<int64_t> candidates, int64_t start, int samples, int settle)
    : cand_(std::move(candidates)), samples_(std::max(1, samples)), settle_(std::max(0, settle)), skip_(settle_) {
  std::sort(cand_.begin(), cand_.end());
  cand_.erase(std::unique(cand_.begin(), cand_.end()), cand_.end());
  const auto it = std::find(cand_.begin(), cand_.end(), start);
  LOOM_CHECK(it != cand_.end(), "train", "parallel.micro_batches=auto: the starting count ", start,
             " is not among the candidates");
  cur_ = start_ = size_t(it - cand_.begin());
}

double MicroBatchTuner::median_time(size_t i) const {
  const auto it = times_.find(i);
  return it == times_.end() || it->second.size() < size_t(samples_) ? 0 : median(it->second);
}

std::optional<MicroBatchTuner::Change> MicroBatchTuner::move_to(size_t to, std::string reason) {
  cur_ = to;
  skip_ = settle_;
  return Change{cand_[to], std::move(reason)};
}

std::optional<MicroBatchTuner::Change> MicroBatchTuner::settle(std::string why) {
  settled_ = true;
  size_t best = cur_;
  for (const auto& [i, t] : times_)
    if (median_time(i) > 0 && median_time(i) < median_time(best)) best = i;
  cur_ = best;
  return Change{cand_[best], str_cat(why, ": settled on ", cand_[best], " (", ms(median_time(best)), " a step)")};
}

std::optional<MicroBatchTuner::Change> MicroBatchTuner::observe(double step_s, double bubble_s) {
  if (settled_) return std::nullopt;
  if (skip_ > 0) {
    --skip_;
    return std::nullopt;
  }
  times_[cur_].push_back(step_s);
  bubbles_[cur_].push_back(bubble_s);
  if (times_[cur_].size() < size_t(samples_)) return std::nullopt;
  const double t = median_time(cur_);
  const int64_t m = cand_[cur_];
  const bool more = cur_ + 1 < cand_.size(), fewer = cur_ > 0;
  if (dir_ == 0) {  // the starting count, measured
    const double bubble = median(bubbles_[cur_]) / t;
    const std::string what = str_cat(m, " micro-batches took ", ms(t), " a step (median of ", samples_, "), ",
                                     std::llround(100 * bubble), "% of it pipeline bubble");
    if (more && (bubble >= kBubbleWorth || !fewer)) {
      dir_ = 1;
      return move_to(cur_ + 1, str_cat(what, ": trying more, ", cand_[cur_ + 1]));
    }
    if (fewer) {
      dir_ = -1;
      return move_to(cur_ - 1, str_cat(what, ": trying fewer and larger ones, ", cand_[cur_ - 1]));
    }
    return settle(str_cat(what, "; no other count is allowed"));
  }
  const size_t from = dir_ > 0 ? cur_ - 1 : cur_ + 1;
  const double tf = median_time(from);
  const bool can_go_on = dir_ > 0 ? more : fewer;
  const size_t next = dir_ > 0 ? cur_ + 1 : cur_ - 1;
  if (t < tf * (1 - kMinGain)) {
    const std::string what =
        str_cat(m, " took ", ms(t), ", ", std::llround(100 * (1 - t / tf)), "% less than ", cand_[from], "'s ", ms(tf));
    if (can_go_on && median_time(next) == 0) return move_to(next, str_cat(what, ": trying ", cand_[next]));
    return settle(what);
  }
  // Within kMinGain of the other count: not worth moving on for (settle() keeps the faster).
  const std::string what =
      str_cat(m, " took ", ms(t), ", not ", std::llround(100 * kMinGain), "% faster than ", cand_[from], "'s ", ms(tf));
  if (!turned_ && from == start_) {
    turned_ = true;
    dir_ = -dir_;
    const bool other = dir_ > 0 ? start_ + 1 < cand_.size() : start_ > 0;
    if (other) {
      const size_t to = dir_ > 0 ? start_ + 1 : start_ - 1;
      return move_to(to, str_cat(what, ": trying the other way, ", cand_[to]));
    }
  }
  return settle(what);
}

}  // namespace loom::train
