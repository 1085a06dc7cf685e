#include "loom/train/progress.h"

#include <unistd.h>

#include <cstdio>

#include "loom/core/timer.h"

namespace loom::train {

ProgressBar::ProgressBar(int64_t total, bool enabled) : total_(total), enabled_(enabled), start_(now_seconds()) {}

bool ProgressBar::stderr_is_terminal() { return isatty(2) != 0; }

std::string format_duration(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

void ProgressBar::update(int64_t done, const std::string& status) {
  if (!enabled_ || total_ <= 0) return;
  const double el = now_seconds() - start_;
  const double frac = double(done) / double(total_);
  const int width = 30, fill = int(frac * width);
  std::string bar(size_t(fill), '#');
  bar += std::string(size_t(width - fill), '.');
  const double eta = done > 0 ? el / double(done) * double(total_ - done) : 0.0;
  std::fprintf(stderr, "\r\033[K[%s] %lld/%lld %s | elapsed %s | ETA %s", bar.c_str(), (long long)done,
               (long long)total_, status.c_str(), format_duration(el).c_str(), format_duration(eta).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (enabled_ && drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
}

void ProgressBar::finish() { clear(); }

}  // namespace loom::train
