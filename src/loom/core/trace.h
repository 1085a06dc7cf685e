// Step traces: timed phases of a run (forward/backward per block, optimizer, collectives,
// pipeline transfers, waits) written as Chrome/Perfetto JSON, one file per rank, which
// `loom trace merge` puts on one timeline. Coarse phases only; not a kernel profiler.
//
// The recorder is process-wide, as a logger is: phases are marked deep inside layers
// (a decoder block, a bucket's wait) that should not take a tracer argument through every
// signature for a diagnostic switched on from the command line. It stays off by default;
// off, a mark costs one relaxed atomic load. Communicators are still passed explicitly.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace loom::trace {

// A named integer attached to an event: bytes, layer, micro-batch. key: a string literal.
struct Arg {
  const char* key = "";
  int64_t value = 0;
};
inline constexpr int kMaxArgs = 3;  // more are ignored

struct Event {
  std::string name;
  const char* category = "";  // a string literal: "compute", "comm", "wait", ...
  double start_s = 0;         // loom::now_seconds() clock
  double duration_s = 0;
  int tid = 0;  // a thread of this process, or a named track (track())
  int n_args = 0;
  std::array<Arg, kMaxArgs> args{};
};

inline constexpr size_t kDefaultMaxEvents = 500000;

namespace detail {
extern std::atomic<bool> g_on;
}
inline bool enabled() { return detail::g_on.load(std::memory_order_relaxed); }

// Forgets what was recorded and records from now on, keeping the first max_events events
// and counting the rest as dropped. The calling thread is named "main" in the file.
void start(size_t max_events = kDefaultMaxEvents);
// Stops recording; what was recorded stays until the next start().
void stop();

// Records a finished phase [start_s, end_s] on the calling thread (nothing when off).
void record(std::string_view name, const char* category, double start_s, double end_s,
            std::initializer_list<Arg> args = {});
// The same on a named track (e.g. "comm dp" for work a group's worker thread does).
void record_on_track(std::string_view track, std::string_view name, const char* category, double start_s, double end_s,
                     std::initializer_list<Arg> args = {});

// This process's clock against rank 0's, measured when the job starts (comm::World):
// rank 0's clock = this clock + offset_s; rtt_s is the round trip of the sample used.
void set_clock_offset(double offset_s, double rtt_s);

std::vector<Event> events();  // in the order they ended
size_t event_count();
uint64_t dropped();

struct FileInfo {
  int rank = 0, world_size = 1;
  std::string command;  // what ran, for the reader: "train configs/x.yaml"
};
// {"traceEvents":[...], "metadata":{rank, world_size, clock_offset_us, ...}}: "X" events
// with ts/dur in microseconds, pid = rank, thread and track names as "M" events. Events
// that overlap without nesting on one thread or track (asynchronous transfers) are spread
// over extra rows of that track, so every row nests, as Perfetto requires.
void write_json(std::ostream& out, const FileInfo& info);

// s with what a JSON string cannot hold as is escaped (quotes, backslashes, control bytes).
std::string json_escape(std::string_view s);

// Marks the scope it lives in as one event on the calling thread.
class Span {
 public:
  Span(const char* name, const char* category, std::initializer_list<Arg> args = {}) {
    if (enabled()) begin(name, category, args);
  }
  ~Span() {
    if (start_s_ >= 0) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  void begin(const char* name, const char* category, std::initializer_list<Arg> args);
  void end();
  const char* name_ = "";
  const char* category_ = "";
  double start_s_ = -1;  // < 0: not recording
  int n_args_ = 0;
  std::array<Arg, kMaxArgs> args_{};
};

}  // namespace loom::trace
