// Watchdog: a thread that watches a CommRecord and, when an operation has been in flight
// longer than the timeout, reports which rank, group, operation and sequence number hang,
// what completed last and, from the progress board, which peers never entered it; then it
// runs the timeout action, by default an abort, so a job whose peer died ends instead of
// hanging forever. Also the rule that picks the timeout.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/progress_board.h"
#include "loom/comm/record.h"

namespace loom::comm {

struct WatchdogOptions {
  double timeout_s = 600;  // <= 0 disables the watchdog
  // Called once, on the watchdog thread, with the message. World installs one that prints
  // it and aborts the MPI job; tests install one that records it.
  std::function<void(const std::string& message)> on_timeout;
  // Where the peers' progress is read, to name the ranks that did not enter the hung
  // operation; null: the message says only that a peer may have died or be stuck.
  std::shared_ptr<const ProgressBoard> board;
};

// The watchdog timeout that applies and where it came from. One rule for every command: the
// command line over the environment (LOOM_COMM_TIMEOUT, which `loom launch --timeout S` sets
// on every rank) over the config.
struct TimeoutChoice {
  double seconds = 600;
  std::string source;  // "command line", "LOOM_COMM_TIMEOUT" or "config"
};
// `env_value` is LOOM_COMM_TIMEOUT's value (null or "" when unset); throws naming the
// variable and the fix when it is not a number of seconds >= 0 (0 disables the watchdog),
// even when the command line decides.
TimeoutChoice resolve_watchdog_timeout(std::optional<double> command_line, const char* env_value, double config_value);

// resolve_watchdog_timeout(nullopt, getenv("LOOM_COMM_TIMEOUT"), fallback).seconds.
double watchdog_timeout_from_env(double fallback);

// "[watchdog] rank 0: all_reduce #17 on group world (8 B) has not completed after 3.0 s;
// last completed: all_reduce #16. " and then, from `peers` (the group's other members on the
// progress board): "Rank 1 did not enter it (its last: all_reduce #16; pid 4242, stopped)."
// or "Every rank entered it; the transport is stuck."; without `peers`, "A peer rank may have
// died or be stuck."
std::string watchdog_message(int rank, const CommEvent& stuck, double waited_s,
                             const std::optional<CommEvent>& last_completed,
                             const std::optional<std::vector<PeerProgress>>& peers = std::nullopt);

class Watchdog {
 public:
  Watchdog(std::shared_ptr<const CommRecord> record, int rank, WatchdogOptions opts);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  bool fired() const;

 private:
  void loop(double created);
  std::shared_ptr<const CommRecord> record_;
  int rank_;
  WatchdogOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace loom::comm
