// Wall-clock helpers for benchmarks and logs (steady clock; never used for results).
#pragma once
#include <chrono>

namespace loom {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(now_seconds()) {}
  void reset() { start_ = now_seconds(); }
  double seconds() const { return now_seconds() - start_; }
  double ms() const { return seconds() * 1e3; }

 private:
  double start_;
};

}  // namespace loom
