// Watchdog: a thread that watches a CommRecord and, when an operation has been in flight
// longer than the timeout, reports which rank, group, operation and sequence number hang
// (and what completed last) and then runs the timeout action, by default an abort, so a
// job whose peer died ends instead of hanging forever.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "loom/comm/record.h"

namespace loom::comm {

struct WatchdogOptions {
  double timeout_s = 600;  // <= 0 disables the watchdog
  // Called once, on the watchdog thread, with the message. World installs one that prints
  // it and aborts the MPI job; tests install one that records it.
  std::function<void(const std::string& message)> on_timeout;
};

// The timeout from LOOM_COMM_TIMEOUT (seconds) if set, else `fallback`; throws naming the
// variable when it is not a number.
double watchdog_timeout_from_env(double fallback);

// "[watchdog] rank 1: all_reduce #17 on group dp (4.00 MiB) has not completed after 3.0 s;
// last completed: all_reduce #16. A peer rank may have died or be stuck."
std::string watchdog_message(int rank, const CommEvent& stuck, double waited_s,
                             const std::optional<CommEvent>& last_completed);

class Watchdog {
 public:
  Watchdog(std::shared_ptr<const CommRecord> record, int rank, WatchdogOptions opts);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  bool fired() const;

 private:
  void loop();
  std::shared_ptr<const CommRecord> record_;
  int rank_;
  WatchdogOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace loom::comm
