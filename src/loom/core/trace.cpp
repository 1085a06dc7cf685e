// The process-wide step-trace recorder and its Chrome/Perfetto JSON writer.
#include "loom/core/trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

#include "loom/core/timer.h"

namespace loom::trace {

namespace detail {
std::atomic<bool> g_on{false};
}

namespace {

// Threads get small ids in the order they first record; named tracks are numbered apart.
constexpr int kFirstTrackId = 10000;
std::atomic<int> g_next_thread_id{1};
thread_local int t_thread_id = 0;

int this_thread_id() {
  if (t_thread_id == 0) t_thread_id = g_next_thread_id.fetch_add(1, std::memory_order_relaxed);
  return t_thread_id;
}

struct Recorder {
  std::mutex mu;
  std::vector<Event> events;
  size_t max_events = kDefaultMaxEvents;
  uint64_t dropped = 0;
  int main_tid = 0;
  std::map<std::string, int, std::less<>> tracks;  // name -> tid
  double clock_offset_s = 0, clock_rtt_s = -1;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

int track_id_locked(Recorder& r, std::string_view name) {
  auto it = r.tracks.find(name);
  if (it != r.tracks.end()) return it->second;
  const int id = kFirstTrackId + int(r.tracks.size());
  r.tracks.emplace(std::string(name), id);
  return id;
}

void append(int tid, bool on_track, std::string_view track, std::string_view name, const char* category, double start_s,
            double end_s, const Arg* args, size_t n_args) {
  Event e;
  e.name = std::string(name);
  e.category = category;
  e.start_s = start_s;
  e.duration_s = std::max(0.0, end_s - start_s);
  e.n_args = int(std::min<size_t>(n_args, kMaxArgs));
  std::copy_n(args, e.n_args, e.args.begin());
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!enabled()) return;
  if (r.events.size() >= r.max_events) {
    ++r.dropped;
    return;
  }
  e.tid = on_track ? track_id_locked(r, track) : tid;
  r.events.push_back(std::move(e));
}

}  // namespace

void start(size_t max_events) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.clear();
  r.max_events = max_events;
  r.events.reserve(std::min<size_t>(max_events, 4096));
  r.dropped = 0;
  r.main_tid = this_thread_id();
  r.clock_offset_s = 0;
  r.clock_rtt_s = -1;
  detail::g_on.store(true, std::memory_order_relaxed);
}

void stop() { detail::g_on.store(false, std::memory_order_relaxed); }

void record(std::string_view name, const char* category, double start_s, double end_s,
            std::initializer_list<Arg> args) {
  if (!enabled()) return;
  append(this_thread_id(), false, {}, name, category, start_s, end_s, args.begin(), args.size());
}

void record_on_track(std::string_view track, std::string_view name, const char* category, double start_s, double end_s,
                     std::initializer_list<Arg> args) {
  if (!enabled()) return;
  append(0, true, track, name, category, start_s, end_s, args.begin(), args.size());
}

void set_clock_offset(double offset_s, double rtt_s) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.clock_offset_s = offset_s;
  r.clock_rtt_s = rtt_s;
}

std::vector<Event> events() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.events;
}

size_t event_count() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.events.size();
}

uint64_t dropped() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.dropped;
}

void Span::begin(const char* name, const char* category, std::initializer_list<Arg> args) {
  name_ = name;
  category_ = category;
  n_args_ = int(std::min<size_t>(args.size(), kMaxArgs));
  std::copy_n(args.begin(), n_args_, args_.begin());
  start_s_ = now_seconds();
}

void Span::end() {
  const double end_s = now_seconds();
  if (!enabled()) return;
  append(this_thread_id(), false, {}, name_, category_, start_s_, end_s, args_.data(), size_t(n_args_));
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

// Row of each event within its thread or track: the first row where it nests inside the
// innermost open event or starts after it ends. Spans of one thread always nest (row 0);
// asynchronous transfers that overlap go to further rows. `order` is sorted by start.
std::vector<int> assign_rows(const std::vector<Event>& ev, const std::vector<size_t>& order) {
  std::vector<int> row(ev.size(), 0);
  std::map<int, std::vector<std::vector<double>>> open;  // tid -> per row, a stack of end times
  for (size_t i : order) {
    const Event& e = ev[i];
    const double end = e.start_s + e.duration_s;
    auto& rows = open[e.tid];
    size_t k = 0;
    for (; k < rows.size(); ++k) {
      auto& stack = rows[k];
      while (!stack.empty() && stack.back() <= e.start_s) stack.pop_back();
      if (stack.empty() || stack.back() >= end) break;
    }
    if (k == rows.size()) rows.emplace_back();
    rows[k].push_back(end);
    row[i] = int(k);
  }
  return row;
}

}  // namespace

void write_json(std::ostream& out, const FileInfo& info) {
  Recorder& r = recorder();
  std::vector<Event> ev;
  std::map<int, std::string> names;
  uint64_t n_dropped = 0;
  double offset_s = 0, rtt_s = -1;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    ev = r.events;
    n_dropped = r.dropped;
    offset_s = r.clock_offset_s;
    rtt_s = r.clock_rtt_s;
    for (const auto& [name, id] : r.tracks) names[id] = name;
    names[r.main_tid] = "main";
  }
  std::vector<size_t> order(ev.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (ev[a].start_s != ev[b].start_s) return ev[a].start_s < ev[b].start_s;
    return ev[a].duration_s > ev[b].duration_s;  // an enclosing event before what it holds
  });
  const std::vector<int> row = assign_rows(ev, order);
  // Output tid of (tid, row): row 0 keeps the tid, further rows get fresh numbers.
  std::map<std::pair<int, int>, int> out_tid;
  int next_tid = kFirstTrackId * 10;
  for (size_t i : order) {
    const auto key = std::make_pair(ev[i].tid, row[i]);
    if (!out_tid.count(key)) out_tid[key] = row[i] == 0 ? ev[i].tid : next_tid++;
  }

  const int pid = info.rank;
  char buf[160];
  out << "{\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out << ",\n";
    first = false;
  };
  sep();
  out << R"({"ph":"M","name":"process_name","pid":)" << pid << R"(,"tid":0,"args":{"name":"rank )" << pid << "\"}}";
  for (const auto& [key, tid] : out_tid) {
    auto it = names.find(key.first);
    std::string name = it != names.end() ? it->second : "thread " + std::to_string(key.first);
    if (key.second > 0) name += " (" + std::to_string(key.second + 1) + ")";
    sep();
    out << R"({"ph":"M","name":"thread_name","pid":)" << pid << ",\"tid\":" << tid << R"(,"args":{"name":")"
        << json_escape(name) << "\"}}";
    sep();
    // Rows of one thread or track stay together, threads before tracks.
    out << R"({"ph":"M","name":"thread_sort_index","pid":)" << pid << ",\"tid\":" << tid << R"(,"args":{"sort_index":)"
        << int64_t(key.first) * 100 + key.second << "}}";
  }
  for (size_t i : order) {
    const Event& e = ev[i];
    sep();
    std::snprintf(buf, sizeof buf, "\"ts\":%.3f,\"dur\":%.3f", e.start_s * 1e6, e.duration_s * 1e6);
    out << "{\"ph\":\"X\",\"name\":\"" << json_escape(e.name) << "\",\"cat\":\"" << json_escape(e.category)
        << "\",\"pid\":" << pid << ",\"tid\":" << out_tid[{e.tid, row[i]}] << "," << buf;
    if (e.n_args > 0) {
      out << ",\"args\":{";
      for (int a = 0; a < e.n_args; ++a)
        out << (a ? "," : "") << '"' << json_escape(e.args[size_t(a)].key) << "\":" << e.args[size_t(a)].value;
      out << "}";
    }
    out << "}";
  }
  std::snprintf(buf, sizeof buf, "\"clock_offset_us\":%.3f,\"clock_rtt_us\":%.3f", offset_s * 1e6,
                rtt_s < 0 ? -1.0 : rtt_s * 1e6);
  out << "\n],\n\"displayTimeUnit\":\"ms\",\n\"metadata\":{\"rank\":" << info.rank
      << ",\"world_size\":" << info.world_size << "," << buf << ",\"events\":" << ev.size()
      << ",\"dropped\":" << n_dropped << ",\"clock\":\"steady\",\"command\":\"" << json_escape(info.command)
      << "\"}}\n";
}

}  // namespace loom::trace
