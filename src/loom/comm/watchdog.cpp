// The comm watchdog thread and the message it prints when an operation hangs.
#include "loom/comm/watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "loom/core/allocator.h"
#include "loom/core/error.h"
#include "loom/core/timer.h"

namespace loom::comm {

double watchdog_timeout_from_env(double fallback) {
  const char* v = std::getenv("LOOM_COMM_TIMEOUT");
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  LOOM_CHECK(end && *end == '\0', "comm", "LOOM_COMM_TIMEOUT=\"", v,
             "\" is not a number of seconds (0 disables the watchdog)");
  return s;
}

std::string watchdog_message(int rank, const CommEvent& stuck, double waited_s,
                             const std::optional<CommEvent>& last_completed) {
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.1f", waited_s);
  std::string last = last_completed ? op_label(last_completed->op, last_completed->seq) : "none";
  return str_cat("[watchdog] rank ", rank, ": ", op_label(stuck.op, stuck.seq), " on group ",
                 stuck.group, " (", format_bytes(stuck.bytes), ") has not completed after ", waited,
                 " s; last completed: ", last, ". A peer rank may have died or be stuck.");
}

Watchdog::Watchdog(std::shared_ptr<const CommRecord> record, int rank, WatchdogOptions opts)
    : record_(std::move(record)), rank_(rank), opts_(std::move(opts)) {
  if (!opts_.on_timeout) {
    opts_.on_timeout = [](const std::string& msg) {
      std::fprintf(stderr, "%s\n", msg.c_str());
      std::fflush(stderr);
      std::abort();
    };
  }
  if (opts_.timeout_s > 0) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Watchdog::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

void Watchdog::loop() {
  // Check often enough to fire within ~10% of the timeout, but at most 4 times a second.
  auto period = std::chrono::duration<double>(std::clamp(opts_.timeout_s / 10, 0.01, 0.25));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, period, [&] { return stop_; });
    if (stop_) return;
    std::vector<CommEvent> running = record_->in_flight();  // oldest first
    if (running.empty()) continue;
    double waited = now_seconds() - running.front().t_start;
    if (waited < opts_.timeout_s) continue;
    const CommEvent& stuck = running.front();
    fired_ = true;
    std::string msg = watchdog_message(rank_, stuck, waited, record_->last_completed(stuck.group));
    lock.unlock();
    opts_.on_timeout(msg);
    return;  // fire once: the action normally ends the process
  }
}

}  // namespace loom::comm
