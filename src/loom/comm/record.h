// CommRecord: a bounded, thread-safe log of communication operations (what, how many bytes,
// which group, sequence number, start/end time, state). The watchdog reads the operations
// in flight; while a step trace records (core/trace.h, --trace DIR) every finished operation
// also goes there, with its bytes. It never blocks an operation for longer than one short
// mutex section.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace loom::comm {

enum class OpState : uint8_t { in_flight, completed, failed };
const char* op_state_name(OpState s);

struct CommEvent {
  std::string op;      // "all_reduce", "send", ...
  std::string group;   // group name
  int64_t bytes = 0;   // total payload of the operation (see docs/DISTRIBUTED.md)
  uint64_t seq = 0;    // per group: collectives and point-to-point counted separately
  double t_start = 0;  // seconds, loom::now_seconds() clock
  double t_end = 0;    // 0 while in flight
  OpState state = OpState::in_flight;
  uint64_t group_key = 0;  // the group's ProgressBoard key (same on every member); 0: none
};

// "all_reduce #17": how logs and the watchdog name an operation.
std::string op_label(const std::string& op, uint64_t seq);

class CommRecord {
 public:
  explicit CommRecord(size_t capacity = 4096) : capacity_(capacity ? capacity : 1) {}

  // Marks an operation as started now; returns the handle for finish().
  uint64_t start(const std::string& op, const std::string& group, int64_t bytes, uint64_t seq, uint64_t group_key = 0);
  void finish(uint64_t handle, bool ok);

  // Operations still running, oldest first.
  std::vector<CommEvent> in_flight() const;
  // Finished operations still held (the newest `capacity`), oldest first.
  std::vector<CommEvent> finished() const;
  // The last operation of `group` that completed successfully, if any is remembered.
  std::optional<CommEvent> last_completed(const std::string& group) const;
  uint64_t total_started() const;

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  uint64_t next_handle_ = 1;
  std::map<uint64_t, CommEvent> running_;  // by handle; handles grow, so oldest first
  std::deque<CommEvent> done_;
  std::map<std::string, CommEvent> last_ok_;  // per group, survives the ring's eviction
};

}  // namespace loom::comm
