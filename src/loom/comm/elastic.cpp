#include "loom/comm/elastic.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <regex>

#include "loom/core/error.h"

namespace loom::comm {

void note_failure_line(const std::string& raw, FailureCause& cause) {
  // A rank's line as `loom launch` relays it ("[rank 3] text"), or as mpirun tags it.
  std::string line = raw;
  static const std::regex relayed(R"(^\[rank \d+\] (.*)$)");
  std::smatch m;
  if (std::regex_match(raw, m, relayed)) line = m[1];
  if (cause.diverged) return;  // decisive: what mpirun says of the teardown after it changes nothing
  if (line.rfind("error: [config]", 0) == 0 || line.rfind("error: [launch]", 0) == 0 ||
      line.rfind("[launch] ", 0) == 0 || line.rfind("usage: loom", 0) == 0) {
    cause.permanent = true;
    if (cause.what.empty()) cause.what = line;
    return;
  }
  if (line.rfind("error: [train] training diverged", 0) == 0 ||
      line.rfind("error: [train] training stopped on non-finite values", 0) == 0) {
    cause.permanent = cause.diverged = true;
    cause.what = line.substr(std::string("error: [train] ").size());
    return;
  }
  static const std::regex watchdog(R"(\[watchdog\] rank (\d+): (.*))");
  if (std::regex_search(line, m, watchdog)) {
    if (!cause.hang) cause = {std::atoi(m[1].str().c_str()), "hang: " + m[2].str(), true};
    return;
  }
  if (cause.hang) return;  // what mpirun says of the ranks the watchdog's abort ended
  static const std::regex signal(R"(process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+) \(([^)]*)\))");
  if (std::regex_search(line, m, signal)) {
    if (cause.rank < 0 || cause.what.empty())
      cause = {std::atoi(m[1].str().c_str()), str_cat("exited on signal ", m[2].str(), " (", m[3].str(), ")"), false};
    return;
  }
  // srun (--label, --kill-on-bad-exit) says which task ended first, then the ones it killed:
  // "srun: error: loomh2: task 3: Exited with exit code 1", "... tasks 0-1: Killed".
  static const std::regex srun_task(R"(^srun: error: \S+: tasks? (\d+)(?:[-,]\S*)?: (.*)$)");
  if (std::regex_search(line, m, srun_task)) {
    if (cause.what.empty()) {
      std::string what = m[2].str();
      if (!what.empty()) what[0] = char(std::tolower(static_cast<unsigned char>(what[0])));
      cause = {std::atoi(m[1].str().c_str()), what, false};
    }
    return;
  }
  static const std::regex abort_re(R"(MPI_ABORT was invoked on rank (\d+) in communicator \S+ with errorcode (\d+))");
  if (std::regex_search(line, m, abort_re)) {
    if (cause.what.empty())
      cause = {std::atoi(m[1].str().c_str()), str_cat("called MPI_Abort with code ", m[2].str()), false};
    return;
  }
  static const std::regex process(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
  if (std::regex_search(line, m, process)) {
    if (cause.what.empty()) cause.rank = std::atoi(m[1].str().c_str());
    return;
  }
  static const std::regex code(R"(^\s*Exit code:\s+(\d+))");
  if (std::regex_search(line, m, code) && cause.what.empty() && cause.rank >= 0) cause.what = "exit code " + m[1].str();
}

std::vector<std::string> restart_args(const std::vector<std::string>& args, bool dp_auto) {
  if (args.empty() || args[0] != "train") return args;
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--overwrite-checkpoints") continue;
    if (a == "--resume") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--resume=", 0) == 0) continue;
    if (dp_auto && i > 0 && args[i - 1] == "--set" && a.rfind("parallel.dp=", 0) == 0) {
      out.pop_back();  // the --set before it
      continue;
    }
    out.push_back(a);
  }
  out.push_back("--resume");
  out.push_back("auto");
  if (dp_auto) {
    out.push_back("--set");
    out.push_back("parallel.dp=auto");
  }
  return out;
}

int shrink_nproc(int nproc, int min_nproc) {
  for (int n = nproc - 1; n >= std::max(1, min_nproc); --n)
    if (nproc % n == 0) return n;
  return -1;
}

std::vector<HostSlots> parse_host_slots(const std::string& hosts) {
  std::vector<HostSlots> out;
  size_t start = 0;
  while (start <= hosts.size()) {
    size_t end = hosts.find(',', start);
    if (end == std::string::npos) end = hosts.size();
    const std::string item = hosts.substr(start, end - start);
    if (!item.empty()) {
      const size_t colon = item.find(':');
      HostSlots h{item.substr(0, colon), 1};
      if (colon != std::string::npos) h.slots = std::atoi(item.c_str() + colon + 1);
      LOOM_CHECK(!h.host.empty() && h.slots >= 1, "launch", "--hosts entry '", item, "' is not host or host:slots");
      out.push_back(h);
    }
    start = end + 1;
  }
  return out;
}

std::string format_host_slots(const std::vector<HostSlots>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += str_cat(s.empty() ? "" : ",", h.host, ":", h.slots);
  return s;
}

std::string host_of_rank(const std::vector<HostSlots>& hosts, int rank) {
  for (const auto& h : hosts) {
    if (rank < h.slots) return rank >= 0 ? h.host : "";
    rank -= h.slots;
  }
  return "";
}

}  // namespace loom::comm
