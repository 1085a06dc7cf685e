// A one-line progress bar with rate and ETA for terminals, redrawn in place on stderr.
// Disabled (prints nothing) when not wanted; log lines clear it first.
#pragma once
#include <cstdint>
#include <string>

namespace loom::train {

class ProgressBar {
 public:
  ProgressBar(int64_t total, bool enabled);
  void update(int64_t done, const std::string& status);
  void clear();  // before printing a normal line
  void finish();
  static bool stderr_is_terminal();

 private:
  int64_t total_;
  bool enabled_;
  double start_;
  bool drawn_ = false;
};

std::string format_duration(double seconds);  // "1h02m", "3m20s", "12.3s"

}  // namespace loom::train
