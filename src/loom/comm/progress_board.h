// ProgressBoard: one slot per rank in memory shared by the ranks of a host, saying for each
// group the last collective the rank started and completed, so that a rank whose collective
// hangs can name the peers that never entered it (and whether their process is stopped or
// gone). Updating it is two relaxed stores per operation; it takes no part in communication.
// Ranks on other hosts do not share the memory: their slots stay blank and read as unknown.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace loom::comm {

// Who a slot belongs to: enough to find the process in /proc and to notice a reused pid.
struct ProcessIdentity {
  int64_t pid = 0;
  uint64_t host = 0;        // hash of the host name
  uint64_t start_time = 0;  // field 22 of /proc/<pid>/stat (clock ticks after boot)
  static ProcessIdentity self();
};

enum class ProcessState : uint8_t { unknown, running, stopped, gone };
const char* process_state_name(ProcessState s);  // "unknown", "running", "stopped", "gone"
// From the text of /proc/<pid>/stat: state T or t is stopped, Z or X gone, any other running;
// gone as well when `expected_start` (if nonzero) differs from field 22, i.e. the pid was reused.
ProcessState parse_proc_stat(const std::string& stat_text, uint64_t expected_start);
// Reads /proc/<pid>/stat; gone when it does not exist.
ProcessState process_state(int64_t pid, uint64_t expected_start);

// What the board says about one member of a group.
struct PeerProgress {
  int rank = 0;                 // world rank
  bool visible = false;         // its slot is written: it shares this host's memory
  bool knows_group = false;     // it has joined the group (so its last_started is meaningful)
  bool table_full = false;      // it ran out of lanes, so a missing group says nothing
  std::string last_started_op;  // "" when it started nothing on the group
  uint64_t last_started_seq = 0;
  int64_t pid = 0;                               // 0 when not visible
  ProcessState process = ProcessState::unknown;  // read from /proc for ranks on this host
};

class ProgressBoard {
 public:
  // Lanes (groups) a rank can hold at once; a group beyond that is not tracked.
  static constexpr int kLanes = 64;
  static size_t bytes_for(int world_size);

  // Over `memory`: at least bytes_for(world_size) zeroed bytes, 8-byte aligned, shared with
  // the other ranks of this host (or private, when sharing failed). The board keeps
  // `memory` alive and writes `self` into slot `rank`.
  ProgressBoard(std::shared_ptr<void> memory, int world_size, int rank, const ProcessIdentity& self);
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // A group this rank belongs to. `key` is the same on every member of the group and differs
  // between groups (it hashes the name, the members' world ranks and how many such groups
  // this rank made before). lane is -1 when every lane is taken.
  struct Lane {
    int index = -1;
    uint64_t key = 0;
  };
  Lane join(const std::string& group_name, const std::vector<int>& world_ranks);
  void leave(const Lane& lane);
  // Called when a collective starts and when it ends; a few relaxed stores, no locks.
  void started(int lane, const std::string& op, uint64_t seq);
  void completed(int lane, const std::string& op, uint64_t seq);

  // The other members of the group with this key, in world-rank order, with the state of
  // their processes when they run on this host; nullopt when the key is not a group this
  // rank joined.
  std::optional<std::vector<PeerProgress>> peers(uint64_t key) const;

 private:
  struct Slot;
  Slot& slot(int rank) const;

  std::shared_ptr<void> memory_;
  int world_size_, rank_;
  uint64_t host_;
  mutable std::mutex mu_;                         // guards the two maps (joins and the watchdog)
  std::map<uint64_t, std::vector<int>> members_;  // by key, the groups joined now
  std::map<uint64_t, uint64_t> joined_before_;    // by name-and-members hash
};

// Memory of `bytes` zeroed bytes shared through the POSIX shared-memory object `name`
// (created if absent), or private memory when that fails. Unmapped when the last owner goes.
std::shared_ptr<void> map_shared_memory(const std::string& name, size_t bytes);
// Removes the name (the mappings stay valid); quiet when it is already gone.
void unlink_shared_memory(const std::string& name);

}  // namespace loom::comm
