// The per-host progress board behind the watchdog's "rank N did not enter it", the /proc
// reading that says whether a peer's process is stopped or gone, and the POSIX shared memory
// the ranks of a host map it from.
#include "loom/comm/progress_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "loom/core/error.h"

namespace loom::comm {

namespace {

constexpr uint64_t kMagic = 0x3162702d6d6f6f6cULL;  // "loom-pb1", little-endian
constexpr uint64_t kUnknownOp = 255;
// The operations a Group records, by code (the low byte of a lane's started/completed word).
constexpr const char* kOpNames[] = {"",           "all_reduce",   "reduce_scatter", "all_gather", "broadcast",
                                    "all_to_all", "all_to_all_v", "barrier",        "split",      "send",
                                    "recv"};

uint64_t op_code(const std::string& op) {
  for (uint64_t i = 1; i < std::size(kOpNames); ++i)
    if (op == kOpNames[i]) return i;
  return kUnknownOp;
}

std::string op_name(uint64_t code) { return code < std::size(kOpNames) ? kOpNames[code] : "operation"; }

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free,
              "the board is shared between processes, so its words must be lock-free");
static_assert(std::atomic_ref<uint64_t>::required_alignment <= alignof(uint64_t));

uint64_t load(uint64_t& word, std::memory_order order = std::memory_order_relaxed) {
  return std::atomic_ref<uint64_t>(word).load(order);
}
void store(uint64_t& word, uint64_t v, std::memory_order order = std::memory_order_relaxed) {
  std::atomic_ref<uint64_t>(word).store(v, order);
}

// FNV-1a, then a splitmix64 finaliser where two hashes are combined.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ULL) {
  auto p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// State letter and start time from the text of /proc/<pid>/stat; false if malformed.
bool parse_stat(const std::string& text, char* state, uint64_t* start_time) {
  // "pid (comm) S f4 f5 ...": comm may hold spaces and parentheses, so split at the last ')'.
  size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream in(text.substr(close + 1));
  std::string field;
  if (!(in >> field) || field.size() != 1) return false;
  *state = field[0];
  for (int i = 4; i <= 22; ++i)  // fields 4 .. 22; 22 is starttime
    if (!(in >> field)) return false;
  char* end = nullptr;
  *start_time = std::strtoull(field.c_str(), &end, 10);
  return end && *end == '\0';
}

std::string read_stat_file(int64_t pid) {
  std::ifstream f("/proc/" + (pid > 0 ? std::to_string(pid) : std::string("self")) + "/stat");
  if (!f) return "";
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

struct ProgressBoard::Slot {
  uint64_t magic, pid, host, start_time, table_full, reserved[3];
  struct {
    uint64_t key, started, completed;  // started/completed: seq << 8 | op code
  } lanes[kLanes];
};

ProcessIdentity ProcessIdentity::self() {
  ProcessIdentity id;
  id.pid = int64_t(getpid());
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  id.host = fnv1a(host, std::strlen(host));
  char state = 0;
  parse_stat(read_stat_file(0), &state, &id.start_time);
  return id;
}

const char* process_state_name(ProcessState s) {
  switch (s) {
    case ProcessState::unknown: return "unknown";
    case ProcessState::running: return "running";
    case ProcessState::stopped: return "stopped";
    case ProcessState::gone: return "gone";
  }
  return "?";
}

ProcessState parse_proc_stat(const std::string& stat_text, uint64_t expected_start) {
  char state = 0;
  uint64_t start = 0;
  if (!parse_stat(stat_text, &state, &start)) return ProcessState::unknown;
  if (expected_start != 0 && start != expected_start) return ProcessState::gone;
  if (state == 'T' || state == 't') return ProcessState::stopped;
  if (state == 'Z' || state == 'X' || state == 'x') return ProcessState::gone;
  return ProcessState::running;
}

ProcessState process_state(int64_t pid, uint64_t expected_start) {
  if (pid <= 0) return ProcessState::unknown;
  std::string text = read_stat_file(pid);
  if (text.empty()) return ProcessState::gone;
  return parse_proc_stat(text, expected_start);
}

size_t ProgressBoard::bytes_for(int world_size) { return sizeof(Slot) * size_t(world_size); }

ProgressBoard::ProgressBoard(std::shared_ptr<void> memory, int world_size, int rank, const ProcessIdentity& self)
    : memory_(std::move(memory)), world_size_(world_size), rank_(rank), host_(self.host) {
  LOOM_CHECK(memory_ != nullptr && world_size >= 1 && rank >= 0 && rank < world_size, "comm", "progress board: rank ",
             rank, " of ", world_size, " needs memory for every rank");
  LOOM_CHECK(reinterpret_cast<uintptr_t>(memory_.get()) % alignof(Slot) == 0, "comm", "progress board: memory is not ",
             alignof(Slot), "-byte aligned");
  Slot& s = slot(rank_);
  store(s.pid, uint64_t(self.pid));
  store(s.host, self.host);
  store(s.start_time, self.start_time);
  store(s.magic, kMagic, std::memory_order_release);
}

ProgressBoard::Slot& ProgressBoard::slot(int rank) const { return static_cast<Slot*>(memory_.get())[rank]; }

ProgressBoard::Lane ProgressBoard::join(const std::string& group_name, const std::vector<int>& world_ranks) {
  bool member = false;
  for (int r : world_ranks) member = member || r == rank_;
  if (!member) return {};
  uint64_t base = fnv1a(group_name.data(), group_name.size());
  base = fnv1a(world_ranks.data(), world_ranks.size() * sizeof(int), mix(base));
  std::lock_guard<std::mutex> lock(mu_);
  // Groups with the same name and members are told apart by their order of creation, which
  // every member shares because creating a group is a collective.
  uint64_t key = mix(base ^ mix(joined_before_[base]++));
  if (key == 0) key = 1;  // 0 marks a free lane
  members_[key] = world_ranks;
  Slot& s = slot(rank_);
  for (int i = 0; i < kLanes; ++i) {
    if (load(s.lanes[i].key) != 0) continue;
    store(s.lanes[i].started, 0);
    store(s.lanes[i].completed, 0);
    store(s.lanes[i].key, key, std::memory_order_release);
    return {i, key};
  }
  store(s.table_full, 1);
  return {-1, key};
}

void ProgressBoard::leave(const Lane& lane) {
  std::lock_guard<std::mutex> lock(mu_);
  members_.erase(lane.key);
  if (lane.index >= 0 && lane.index < kLanes) store(slot(rank_).lanes[lane.index].key, 0, std::memory_order_release);
}

void ProgressBoard::started(int lane, const std::string& op, uint64_t seq) {
  if (lane < 0 || lane >= kLanes) return;
  store(slot(rank_).lanes[lane].started, seq << 8 | op_code(op));
}

void ProgressBoard::completed(int lane, const std::string& op, uint64_t seq) {
  if (lane < 0 || lane >= kLanes) return;
  store(slot(rank_).lanes[lane].completed, seq << 8 | op_code(op));
}

std::optional<std::vector<PeerProgress>> ProgressBoard::peers(uint64_t key) const {
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = members_.find(key);
    if (key == 0 || it == members_.end()) return std::nullopt;
    members = it->second;
  }
  std::vector<PeerProgress> out;
  for (int r : members) {
    if (r == rank_) continue;
    PeerProgress p;
    p.rank = r;
    if (r < 0 || r >= world_size_ || load(slot(r).magic, std::memory_order_acquire) != kMagic) {
      out.push_back(p);
      continue;
    }
    Slot& s = slot(r);
    p.visible = true;
    p.pid = int64_t(load(s.pid));
    p.table_full = load(s.table_full) != 0;
    for (auto& lane : s.lanes) {
      if (load(lane.key, std::memory_order_acquire) != key) continue;
      p.knows_group = true;
      uint64_t started = load(lane.started);
      p.last_started_seq = started >> 8;
      if (p.last_started_seq > 0) p.last_started_op = op_name(started & 0xff);
      break;
    }
    if (load(s.host) == host_) p.process = process_state(p.pid, load(s.start_time));
    out.push_back(std::move(p));
  }
  return out;
}

std::shared_ptr<void> map_shared_memory(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd >= 0) {
    // Every rank sets the same size, so the order of their calls does not matter.
    void* p =
        ftruncate(fd, off_t(bytes)) == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (p != MAP_FAILED) return std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
  }
  // No shared memory (no /dev/shm, a full one): peers will read this rank as unknown.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  LOOM_CHECK(p != MAP_FAILED, "comm", "cannot map ", bytes, " bytes for the progress board: ", std::strerror(errno));
  return std::shared_ptr<void>(p, [bytes](void* q) { munmap(q, bytes); });
}

void unlink_shared_memory(const std::string& name) { shm_unlink(name.c_str()); }

}  // namespace loom::comm
