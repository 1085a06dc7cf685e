// `--trace DIR` around `loom train` and `loom bench <x>`, and `loom trace merge DIR`, which
// puts the ranks' files on rank 0's clock in one Chrome/Perfetto timeline. What is recorded
// and how the clocks are measured: loom/core/trace.h, comm/world.cpp, docs/OBSERVABILITY.md.
#include "tools/loom/trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/io/file.h"

namespace loom::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kTraceEnv = "LOOM_TRACE_DIR";
bool is_help(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--") return false;
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

bool has_option(const std::vector<std::string>& args, const std::string& name) {
  for (const auto& a : args) {
    if (a == "--") return false;
    if (a == name || a.rfind(name + "=", 0) == 0) return true;
  }
  return false;
}

// Removes "--trace DIR" / "--trace=DIR" from args (not after a "--", which belongs to an
// inner command) and returns DIR, or "" when not given.
std::string take_trace_dir(std::vector<std::string>& args) {
  std::string dir;
  for (size_t i = 0; i < args.size() && args[i] != "--";) {
    if (args[i] == "--trace") {
      if (i + 1 >= args.size() || args[i + 1].empty() || args[i + 1] == "--")
        throw UsageError("[trace] --trace needs a directory: --trace DIR");
      dir = args[i + 1];
      args.erase(args.begin() + long(i), args.begin() + long(i) + 2);
    } else if (args[i].rfind("--trace=", 0) == 0) {
      dir = args[i].substr(8);
      if (dir.empty()) throw UsageError("[trace] --trace needs a directory: --trace DIR");
      args.erase(args.begin() + long(i));
    } else {
      ++i;
    }
  }
  return dir;
}

// Writes this process's trace to DIR/trace-rank<R>.json (atomically: a reader never sees half
// a file) and returns its path.
std::string write_trace_file(const std::string& dir, const std::string& command) {
  const comm::LaunchEnv env = comm::launch_env();
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_CHECK(!ec, "trace", dir, ": cannot create the directory (", ec.message(), ")");
  const std::string path = (fs::path(dir) / str_cat("trace-rank", env.rank, ".json")).string();
  std::ostringstream out;
  trace::write_json(out, {env.rank, env.world_size, command});
  io::write_file_atomic(path, out.str());
  return path;
}

void report_written(const std::string& path, const std::string& dir) {
  const uint64_t dropped = trace::dropped();
  if (dropped > 0)
    std::fprintf(stderr, "[trace] %s: %llu events dropped over the cap of %zu; trace fewer steps\n", path.c_str(),
                 static_cast<unsigned long long>(dropped), trace::kDefaultMaxEvents);
  if (comm::launch_env().is_primary())
    std::printf("[trace] wrote %s (%zu events)%s; `loom trace merge %s` puts all ranks on one timeline\n", path.c_str(),
                trace::event_count(), comm::launch_env().world_size > 1 ? ", every rank its own file" : "",
                dir.c_str());
}

}  // namespace

int run_command(const Command& c, std::vector<std::string> args) {
  // --help and the test modes (commands.h) go straight to the command, whose options list
  // --trace: nothing runs, so nothing is traced.
  if (c.name != "train" && c.name != "bench") return c.run(args);
  if (is_help(args) || parse_only_mode()) return c.run(args);
  std::string dir = take_trace_dir(args);
  if (dir.empty())
    if (const char* e = std::getenv(kTraceEnv); e && *e) dir = e;
  if (dir.empty()) return c.run(args);
  // `loom launch` forwards LOOM_* to the ranks: a bench that relaunches itself under MPI
  // (--nproc/--hosts) hands them the directory; this process only waits for them.
  setenv(kTraceEnv, dir.c_str(), 1);
  // bench finetune always starts its ranks itself (one launch per degree and round).
  const bool only_launches =
      c.name == "bench" && !comm::launch_env().under_mpi &&
      (has_option(args, "--nproc") || has_option(args, "--hosts") || (!args.empty() && args[0] == "finetune"));
  if (only_launches) return c.run(args);

  std::string command = c.name;
  for (const auto& a : args) command += " " + a;
  trace::start();
  int rc = 0;
  try {
    rc = c.run(args);
  } catch (...) {
    trace::stop();
    try {
      report_written(write_trace_file(dir, command), dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
    }
    throw;
  }
  trace::stop();
  report_written(write_trace_file(dir, command), dir);
  return rc;
}

// ---- loom trace merge ---------------------------------------------------------------------

namespace {

struct RankTrace {
  int rank = 0;
  std::string path;
  json doc;
  double offset_us = 0, rtt_us = -1;
  int64_t dropped = 0;
};

RankTrace read_rank_trace(const fs::path& file, int rank_in_name) {
  RankTrace t;
  t.path = file.string();
  std::ifstream in(file);
  LOOM_CHECK(in, "trace", t.path, ": cannot read (", std::strerror(errno), ")");
  try {
    t.doc = json::parse(in);
  } catch (const json::exception& e) {
    fail("trace", t.path, ": not valid JSON (", e.what(), "); was it written completely?");
  }
  LOOM_CHECK(t.doc.is_object() && t.doc.contains("traceEvents") && t.doc["traceEvents"].is_array(), "trace", t.path,
             ": not a trace file (no traceEvents)");
  t.rank = rank_in_name;
  if (t.doc.contains("metadata") && t.doc["metadata"].is_object()) {
    const json& m = t.doc["metadata"];
    if (m.contains("rank")) {
      LOOM_CHECK(m["rank"].is_number_integer() && m["rank"].get<int>() == rank_in_name, "trace", t.path,
                 ": metadata says rank ", m["rank"].dump(), " but the file name says ", rank_in_name,
                 "; files renamed by hand?");
    }
    if (m.contains("clock_offset_us") && m["clock_offset_us"].is_number())
      t.offset_us = m["clock_offset_us"].get<double>();
    if (m.contains("clock_rtt_us") && m["clock_rtt_us"].is_number()) t.rtt_us = m["clock_rtt_us"].get<double>();
    if (m.contains("dropped") && m["dropped"].is_number_integer()) t.dropped = m["dropped"].get<int64_t>();
  }
  for (const json& e : t.doc["traceEvents"]) {
    LOOM_CHECK(e.is_object() && e.contains("ph") && e["ph"].is_string(), "trace", t.path,
               ": an event without \"ph\": ", e.dump().substr(0, 120));
    if (e["ph"] != "M")
      LOOM_CHECK(e.contains("ts") && e["ts"].is_number(), "trace", t.path,
                 ": an event without a numeric \"ts\": ", e.dump().substr(0, 120));
  }
  return t;
}

std::vector<RankTrace> read_trace_dir(const std::string& dir) {
  LOOM_CHECK(fs::is_directory(dir), "trace", dir, ": no such directory; give the DIR of --trace DIR");
  const std::regex name("trace-rank([0-9]{1,7})\\.json");
  std::vector<RankTrace> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || !std::regex_match(file, m, name)) continue;
    out.push_back(read_rank_trace(entry.path(), std::stoi(m[1].str())));
  }
  LOOM_CHECK(!out.empty(), "trace", dir, ": no trace-rank<R>.json files; write them with --trace ", dir,
             " on loom train or loom bench");
  std::sort(out.begin(), out.end(), [](const RankTrace& a, const RankTrace& b) { return a.rank < b.rank; });
  return out;
}

int trace_merge(const std::vector<std::string>& argv) {
  auto app = new_app("trace merge",
                     "Puts the per-rank traces DIR/trace-rank<R>.json (written by --trace DIR on loom train or loom "
                     "bench) on one timeline: each rank's events shifted onto rank 0's clock by the offset measured "
                     "when the job started, one process per rank. Writes DIR/merged.json (or FILE) for "
                     "ui.perfetto.dev or chrome://tracing and prints the ranks, event count, time span and the N "
                     "event names with the most total time.");
  std::string dir, out_path;
  int64_t top = 10;
  app->add_option("DIR", dir, "the --trace directory")->type_name("DIR")->required();
  app->add_option("--out", out_path, "the merged trace (default: DIR/merged.json)")->type_name("FILE");
  app->add_option("--top", top, "event names to list by total time")->type_name("N")->check(non_negative());
  if (auto rc = parse(*app, argv)) return *rc;
  if (out_path.empty()) out_path = (fs::path(dir) / "merged.json").string();

  std::vector<RankTrace> ranks = read_trace_dir(dir);
  // Every rank's events on rank 0's clock, then the earliest at 0.
  json meta = json::array(), events = json::array();
  double t0 = std::numeric_limits<double>::infinity();
  for (RankTrace& r : ranks) {
    for (json& e : r.doc["traceEvents"]) {
      e["pid"] = r.rank;
      if (e.contains("ts")) {
        e["ts"] = e["ts"].get<double>() + r.offset_us;
        t0 = std::min(t0, e["ts"].get<double>());
      }
      if (e["ph"] == "M") {
        if (e.value("name", "") != "process_name") meta.push_back(std::move(e));
      } else {
        events.push_back(std::move(e));
      }
    }
    meta.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", r.rank},
                    {"tid", 0},
                    {"args", {{"name", str_cat("rank ", r.rank)}}}});
    meta.push_back(
        {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r.rank}, {"tid", 0}, {"args", {{"sort_index", r.rank}}}});
  }
  if (!std::isfinite(t0)) t0 = 0;
  for (json& e : events) e["ts"] = std::round((e["ts"].get<double>() - t0) * 1e3) / 1e3;
  std::stable_sort(events.begin(), events.end(),
                   [](const json& x, const json& y) { return x["ts"].get<double>() < y["ts"].get<double>(); });

  double span_us = 0;
  struct Total {
    double us = 0;
    int64_t count = 0;
  };
  std::map<std::string, Total> totals;
  for (const json& e : events) {
    const double dur = e.contains("dur") && e["dur"].is_number() ? e["dur"].get<double>() : 0.0;
    span_us = std::max(span_us, e["ts"].get<double>() + dur);
    Total& t = totals[e.value("name", "?")];
    t.us += dur;
    ++t.count;
  }

  json merged;
  merged["traceEvents"] = std::move(meta);
  for (json& e : events) merged["traceEvents"].push_back(std::move(e));
  merged["displayTimeUnit"] = "ms";
  json offsets = json::object();
  for (const RankTrace& r : ranks) offsets[std::to_string(r.rank)] = r.offset_us;
  merged["metadata"] = {
      {"ranks", ranks.size()}, {"clock_offsets_us", offsets}, {"time_origin_us", t0}, {"source", dir}};
  io::write_file_atomic(out_path, merged.dump() + "\n");

  std::printf("merged %zu rank%s into %s: %zu events over %.3f ms\n", ranks.size(), ranks.size() == 1 ? "" : "s",
              out_path.c_str(), events.size(), span_us / 1e3);
  for (const RankTrace& r : ranks) {
    if (r.rank == 0 || r.rtt_us < 0)
      std::printf("  rank %d  %s  reference clock", r.rank, r.path.c_str());
    else
      std::printf("  rank %d  %s  clock offset %+.1f us (round trip %.1f us)", r.rank, r.path.c_str(),
                  std::abs(r.offset_us) < 0.05 ? 0.0 : r.offset_us, r.rtt_us);
    if (r.dropped > 0) std::printf("  %lld events dropped", static_cast<long long>(r.dropped));
    std::printf("\n");
  }
  std::vector<std::pair<std::string, Total>> by_time(totals.begin(), totals.end());
  std::sort(by_time.begin(), by_time.end(), [](const auto& x, const auto& y) { return x.second.us > y.second.us; });
  std::printf("top events by total time (all ranks):\n");
  for (size_t i = 0; i < by_time.size() && int64_t(i) < top; ++i)
    std::printf("  %-28s %8lld x %10.3f ms\n", by_time[i].first.c_str(),
                static_cast<long long>(by_time[i].second.count), by_time[i].second.us / 1e3);
  return 0;
}

}  // namespace

int cmd_trace(const std::vector<std::string>& args) {
  if (args.empty() && describe_subcommands({"merge"})) return 0;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf(
        "usage: loom trace merge DIR [options]\n\n"
        "  merge   put the per-rank traces of --trace DIR on one timeline (loom trace merge --help)\n");
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "merge") return trace_merge({args.begin() + 1, args.end()});
  throw UsageError("[trace] unknown subcommand '" + args[0] + "'; the one there is: loom trace merge DIR");
}

}  // namespace loom::cli
