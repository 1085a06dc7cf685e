// The comm watchdog thread, the message it prints when an operation hangs, and the rule
// that picks its timeout.
#include "loom/comm/watchdog.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "loom/core/allocator.h"
#include "loom/core/error.h"
#include "loom/core/timer.h"

namespace loom::comm {

TimeoutChoice resolve_watchdog_timeout(std::optional<double> command_line, const char* env_value, double config_value) {
  std::optional<double> from_env;
  if (env_value && *env_value) {  // checked even when the command line decides: it is a mistake
    char* end = nullptr;
    double s = std::strtod(env_value, &end);
    LOOM_CHECK(end != env_value && *end == '\0' && std::isfinite(s) && s >= 0, "comm", "LOOM_COMM_TIMEOUT=\"",
               env_value,
               "\" is not a number of seconds >= 0; set it to e.g. 600 (0 disables the watchdog) "
               "or unset it");
    from_env = s;
  }
  if (command_line) return {*command_line, "command line"};
  if (from_env) return {*from_env, "LOOM_COMM_TIMEOUT"};
  return {config_value, "config"};
}

double watchdog_timeout_from_env(double fallback) {
  return resolve_watchdog_timeout(std::nullopt, std::getenv("LOOM_COMM_TIMEOUT"), fallback).seconds;
}

namespace {

// "rank 4", "ranks 1, 3", "ranks 4-7, 9": consecutive runs of three or more as a range.
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) s += ", ";
    if (j >= i + 2) {
      s += str_cat(ranks[i], "-", ranks[j]);
      i = j + 1;
    } else {
      s += std::to_string(ranks[i]);
      ++i;
    }
  }
  return s;
}

std::string capitalized(std::string s) {
  if (!s.empty()) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

std::string pid_and_state(const PeerProgress& p) {
  std::string s = str_cat("pid ", p.pid);
  if (p.process != ProcessState::unknown) s += str_cat(", ", process_state_name(p.process));
  return s;
}

bool halted(const PeerProgress& p) { return p.process == ProcessState::stopped || p.process == ProcessState::gone; }

// What the board says about the group's other members, as sentences that start with a space.
std::string peers_sentences(const CommEvent& stuck, const std::vector<PeerProgress>& peers) {
  // Send/recv are numbered per rank, not per group, so their numbers say nothing about a
  // peer; only a stopped or dead process does.
  const bool point_to_point = stuck.op == "send" || stuck.op == "recv";
  constexpr size_t kNamed = 8;  // ranks described one by one; the rest only listed
  std::vector<const PeerProgress*> behind;
  std::vector<std::string> halted_inside;  // "rank 2 is now stopped (pid 7)"
  std::vector<int> unknown;
  for (const PeerProgress& p : peers) {
    if (!p.visible || (!p.knows_group && p.table_full)) {
      unknown.push_back(p.rank);
    } else if (!point_to_point && (!p.knows_group || p.last_started_seq < stuck.seq)) {
      behind.push_back(&p);
    } else if (halted(p) && halted_inside.size() < kNamed) {
      halted_inside.push_back(
          str_cat("rank ", p.rank, " is now ", process_state_name(p.process), " (pid ", p.pid, ")"));
    }
  }
  std::string halted_list;  // "rank 2 is now stopped (pid 7) and rank 3 is now gone (pid 8)"
  for (size_t i = 0; i < halted_inside.size(); ++i)
    halted_list += (i == 0 ? "" : i + 1 == halted_inside.size() ? " and " : ", ") + halted_inside[i];
  if (point_to_point)
    return halted_list.empty() ? " A peer rank may have died or be stuck."
                               : str_cat(" ", capitalized(halted_list), ".");
  std::string s;
  if (behind.empty()) {
    s = unknown.empty() ? " Every rank entered it" : " Every rank on this host entered it";
    if (!halted_list.empty())
      s += str_cat(", but ", halted_list, ".");
    else
      s += unknown.empty() ? "; the transport is stuck." : ".";
  } else {
    for (size_t i = 0; i < behind.size() && i < kNamed; ++i) {
      const PeerProgress& p = *behind[i];
      std::string last = !p.knows_group ? str_cat("it has not joined group ", stuck.group)
                         : p.last_started_seq == 0
                             ? std::string("its last: none")
                             : str_cat("its last: ", op_label(p.last_started_op, p.last_started_seq));
      s += str_cat(" Rank ", p.rank, " did not enter it (", last, "; ", pid_and_state(p), ").");
    }
    if (behind.size() > kNamed) {
      std::vector<int> rest;
      for (size_t i = kNamed; i < behind.size(); ++i) rest.push_back(behind[i]->rank);
      s += str_cat(" Nor did ", rank_list(rest), ".");
    }
    if (!halted_list.empty()) s += str_cat(" Of those that entered it, ", halted_list, ".");
  }
  if (!unknown.empty())
    s += str_cat(" ", capitalized(rank_list(unknown)), unknown.size() == 1 ? " is" : " are", " not on this host; ",
                 unknown.size() == 1 ? "its" : "their", " progress is unknown.");
  return s;
}

}  // namespace

std::string watchdog_message(int rank, const CommEvent& stuck, double waited_s,
                             const std::optional<CommEvent>& last_completed,
                             const std::optional<std::vector<PeerProgress>>& peers) {
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.1f", waited_s);
  std::string last = last_completed ? op_label(last_completed->op, last_completed->seq) : "none";
  std::string who = peers ? peers_sentences(stuck, *peers) : std::string(" A peer rank may have died or be stuck.");
  return str_cat("[watchdog] rank ", rank, ": ", op_label(stuck.op, stuck.seq), " on group ", stuck.group, " (",
                 format_bytes(stuck.bytes), ") has not completed after ", waited, " s; last completed: ", last, ".",
                 who);
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
  if (opts_.timeout_s > 0) thread_ = std::thread([this, created = now_seconds()] { loop(created); });
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

void Watchdog::loop(double created) {
  // Check often enough to fire within ~10% of the timeout, but at most 4 times a second.
  auto period = std::chrono::duration<double>(std::clamp(opts_.timeout_s / 10, 0.01, 0.25));
  // From the construction, not the thread's start, so a stop before the first check counts.
  double last_check = created, resumed_at = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, period, [&] { return stop_; });
    if (stop_) return;
    // A check far later than scheduled means this process itself was stopped (SIGSTOP, a
    // debugger): its operations were not waiting for peers meanwhile, so count from now.
    double now = now_seconds();
    if (now - last_check > period.count() + 1.0) resumed_at = now;
    last_check = now;
    std::vector<CommEvent> running = record_->in_flight();  // oldest first
    if (running.empty()) continue;
    double waited = now - std::max(running.front().t_start, resumed_at);
    if (waited < opts_.timeout_s) continue;
    const CommEvent& stuck = running.front();
    fired_ = true;
    std::optional<std::vector<PeerProgress>> peers;
    if (opts_.board) peers = opts_.board->peers(stuck.group_key);
    std::string msg = watchdog_message(rank_, stuck, waited, record_->last_completed(stuck.group), peers);
    lock.unlock();
    opts_.on_timeout(msg);
    return;  // fire once: the action normally ends the process
  }
}

}  // namespace loom::comm
