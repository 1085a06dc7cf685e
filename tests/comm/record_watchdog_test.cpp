// CommRecord bounds, Chrome trace output, the watchdog's detection and message and the rule
// that picks its timeout, in one process (the multi-rank abort is tested by
// tests/comm/watchdog_test.sh and tests/comm/train_timeout_test.sh under mpiexec).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

#include "loom/comm/record.h"
#include "loom/comm/watchdog.h"
#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/core/trace.h"

using namespace loom;
using namespace loom::comm;

TEST(CommRecord, KeepsTheNewestFinishedAndEveryRunning) {
  CommRecord r(3);
  uint64_t stuck = r.start("recv", "pp", 64, 1);
  for (uint64_t i = 1; i <= 5; ++i) r.finish(r.start("all_reduce", "dp", 1024, i), true);
  std::vector<CommEvent> done = r.finished();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done.front().seq, 3u);
  EXPECT_EQ(done.back().seq, 5u);
  ASSERT_EQ(r.in_flight().size(), 1u);
  EXPECT_EQ(r.in_flight()[0].op, "recv");
  EXPECT_EQ(r.last_completed("dp")->seq, 5u);
  EXPECT_FALSE(r.last_completed("pp").has_value());
  r.finish(stuck, false);
  EXPECT_TRUE(r.in_flight().empty());
  EXPECT_EQ(r.finished().back().state, OpState::failed);
  EXPECT_EQ(r.total_started(), 6u);
}

TEST(CommRecord, FinishedOperationsGoToTheStepTraceOnTheirGroupsTrack) {
  CommRecord r;
  r.finish(r.start("reduce_scatter", "dp", 64, 1), true);  // before tracing: not recorded
  trace::start();
  r.finish(r.start("all_gather", "tp", 2048, 7), true);
  r.finish(r.start("send", "pp\"x", 8, 1), false);  // the quote must be escaped
  r.start("recv", "pp", 8, 2);                      // still running: not in the trace
  trace::stop();
  std::ostringstream os;
  trace::write_json(os, {3, 4, "test"});
  const std::string s = os.str();
  EXPECT_EQ(s.find("reduce_scatter"), std::string::npos) << s;
  EXPECT_EQ(s.find("\"recv\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"name\":\"all_gather\",\"cat\":\"comm\",\"pid\":3"), std::string::npos) << s;
  EXPECT_NE(s.find("\"args\":{\"bytes\":2048,\"seq\":7,\"ok\":1}"), std::string::npos) << s;
  EXPECT_NE(s.find("\"args\":{\"bytes\":8,\"seq\":1,\"ok\":0}"), std::string::npos) << s;
  EXPECT_NE(s.find("\"name\":\"comm tp\""), std::string::npos) << s;
  EXPECT_NE(s.find("comm pp\\\"x"), std::string::npos) << s;
}

TEST(Watchdog, MessageNamesRankGroupOpAndLastCompleted) {
  CommEvent stuck{"all_reduce", "dp", 4 << 20, 17, 0, 0, OpState::in_flight};
  CommEvent last{"all_reduce", "dp", 4 << 20, 16, 0, 1, OpState::completed};
  EXPECT_EQ(watchdog_message(1, stuck, 3.04, last),
            "[watchdog] rank 1: all_reduce #17 on group dp (4.00 MiB) has not completed after "
            "3.0 s; last completed: all_reduce #16. A peer rank may have died or be stuck.");
  EXPECT_NE(watchdog_message(0, stuck, 1, std::nullopt).find("last completed: none."), std::string::npos);
}

TEST(Watchdog, FiresOnceAfterTheTimeoutAndNotBefore) {
  auto record = std::make_shared<CommRecord>();
  std::atomic<int> fired{0};
  std::string message;
  std::mutex mu;
  WatchdogOptions o;
  o.timeout_s = 0.3;
  o.on_timeout = [&](const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    message = m;
    ++fired;
  };
  Watchdog wd(record, 2, o);
  // Operations that finish in time do not trigger it.
  for (int i = 1; i <= 3; ++i) record->finish(record->start("barrier", "world", 0, uint64_t(i)), true);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(fired.load(), 0);

  // Not before the timeout, by the watchdog's own account of the wait and by the clock started
  // before the operation; no upper bound on the time, which on a loaded machine is the
  // scheduler's: the deadline below only ends a watchdog that never fires.
  Stopwatch sw;
  record->start("all_gather", "world", 1000, 4);
  while (fired.load() == 0 && sw.seconds() < 30) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double t = sw.seconds();
  ASSERT_EQ(fired.load(), 1) << "no watchdog message after " << t << " s";
  EXPECT_GE(t, 0.3);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(message.find("[watchdog] rank 2: all_gather #4 on group world"), std::string::npos) << message;
    EXPECT_NE(message.find("last completed: barrier #3."), std::string::npos) << message;
    std::smatch waited;
    ASSERT_TRUE(std::regex_search(message, waited, std::regex("has not completed after ([0-9.e+-]+) s"))) << message;
    EXPECT_GE(std::stod(waited[1].str()), 0.3) << message;
  }
  EXPECT_TRUE(wd.fired());
  // Once: the operation is still running ten periods of checks (0.03 s each) later.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(fired.load(), 1);
}

namespace {

PeerProgress peer(int rank, uint64_t last_seq, ProcessState state, int64_t pid) {
  PeerProgress p;
  p.rank = rank;
  p.visible = p.knows_group = true;
  p.last_started_seq = last_seq;
  if (last_seq > 0) p.last_started_op = "all_reduce";
  p.pid = pid;
  p.process = state;
  return p;
}

PeerProgress elsewhere(int rank) {
  PeerProgress p;
  p.rank = rank;
  return p;
}

}  // namespace

TEST(Watchdog, MessageNamesThePeersThatDidNotEnter) {
  CommEvent stuck{"all_reduce", "world", 8, 17, 0, 0, OpState::in_flight};
  CommEvent last{"all_reduce", "world", 8, 16, 0, 1, OpState::completed};
  const std::string head =
      "[watchdog] rank 0: all_reduce #17 on group world (8 B) has not completed after 3.0 s; "
      "last completed: all_reduce #16.";
  auto msg = [&](std::vector<PeerProgress> peers) { return watchdog_message(0, stuck, 3.0, last, peers); };

  EXPECT_EQ(msg({peer(1, 16, ProcessState::stopped, 4242)}),
            head + " Rank 1 did not enter it (its last: all_reduce #16; pid 4242, stopped).");
  EXPECT_EQ(msg({peer(1, 17, ProcessState::running, 5), peer(2, 18, ProcessState::running, 6)}),
            head + " Every rank entered it; the transport is stuck.");
  EXPECT_EQ(msg({peer(1, 17, ProcessState::running, 5), peer(2, 17, ProcessState::stopped, 6)}),
            head + " Every rank entered it, but rank 2 is now stopped (pid 6).");
  EXPECT_EQ(msg({peer(1, 0, ProcessState::gone, 7), peer(2, 17, ProcessState::unknown, 8), elsewhere(4), elsewhere(5),
                 elsewhere(6), elsewhere(7)}),
            head +
                " Rank 1 did not enter it (its last: none; pid 7, gone). Ranks 4-7 are not on this "
                "host; their progress is unknown.");
  EXPECT_EQ(msg({peer(1, 16, ProcessState::running, 5), peer(2, 17, ProcessState::stopped, 6),
                 peer(3, 17, ProcessState::gone, 7), elsewhere(5)}),
            head +
                " Rank 1 did not enter it (its last: all_reduce #16; pid 5, running). Of those "
                "that entered it, rank 2 is now stopped (pid 6) and rank 3 is now gone (pid 7). "
                "Rank 5 is not on this host; its progress is unknown.");
  EXPECT_EQ(msg({peer(2, 17, ProcessState::stopped, 6), elsewhere(1)}),
            head +
                " Every rank on this host entered it, but rank 2 is now stopped (pid 6). Rank 1 "
                "is not on this host; its progress is unknown.");
  EXPECT_EQ(msg({peer(1, 17, ProcessState::running, 5), elsewhere(3)}),
            head +
                " Every rank on this host entered it. Rank 3 is not on this host; its progress is "
                "unknown.");
  PeerProgress not_joined = peer(1, 0, ProcessState::running, 9);
  not_joined.knows_group = false;
  EXPECT_EQ(msg({not_joined}), head + " Rank 1 did not enter it (it has not joined group world; pid 9, running).");
  not_joined.table_full = true;  // its table overflowed: nothing can be said
  EXPECT_EQ(msg({not_joined}), head +
                                   " Every rank on this host entered it. Rank 1 is not on this host; its progress "
                                   "is unknown.");

  // Many behind: eight described, the rest listed.
  std::vector<PeerProgress> many;
  for (int r = 1; r <= 11; ++r) many.push_back(peer(r, 16, ProcessState::running, 100 + r));
  std::string m = msg(many);
  EXPECT_NE(m.find("Rank 8 did not enter it (its last: all_reduce #16; pid 108, running). Nor did "
                   "ranks 9-11."),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("Rank 9 did"), std::string::npos) << m;

  // Point-to-point numbers are per rank: only a stopped or dead peer is worth naming.
  CommEvent recv{"recv", "pp", 64, 3, 0, 0, OpState::in_flight};
  std::vector<PeerProgress> stopped = {peer(1, 0, ProcessState::stopped, 9)};
  std::vector<PeerProgress> running = {peer(1, 0, ProcessState::running, 9)};
  EXPECT_EQ(watchdog_message(2, recv, 3.0, std::nullopt, stopped),
            "[watchdog] rank 2: recv #3 on group pp (64 B) has not completed after 3.0 s; last "
            "completed: none. Rank 1 is now stopped (pid 9).");
  EXPECT_NE(watchdog_message(2, recv, 3.0, std::nullopt, running).find("none. A peer rank may have died or be stuck."),
            std::string::npos);
}

TEST(WatchdogTimeout, CommandLineOverEnvironmentOverConfig) {
  TimeoutChoice c = resolve_watchdog_timeout(2.0, "50", 600);
  EXPECT_EQ(c.seconds, 2.0);
  EXPECT_EQ(c.source, "command line");
  c = resolve_watchdog_timeout(std::nullopt, "3", 600);
  EXPECT_EQ(c.seconds, 3.0);
  EXPECT_EQ(c.source, "LOOM_COMM_TIMEOUT");
  c = resolve_watchdog_timeout(std::nullopt, nullptr, 600);
  EXPECT_EQ(c.seconds, 600.0);
  EXPECT_EQ(c.source, "config");
  c = resolve_watchdog_timeout(std::nullopt, "", 45);  // set but empty: as unset
  EXPECT_EQ(c.seconds, 45.0);
  EXPECT_EQ(c.source, "config");
  c = resolve_watchdog_timeout(std::nullopt, "0", 45);  // 0 disables the watchdog
  EXPECT_EQ(c.seconds, 0.0);
  EXPECT_EQ(c.source, "LOOM_COMM_TIMEOUT");
  // A bad environment value is an error even when the command line decides.
  for (const char* bad : {"soon", "3s", "-1", "nan", "inf", " "}) {
    try {
      resolve_watchdog_timeout(bad[0] == 's' ? std::optional<double>(2.0) : std::nullopt, bad, 600);
      FAIL() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), str_cat("[comm] LOOM_COMM_TIMEOUT=\"", bad,
                                               "\" is not a number of seconds >= 0; set "
                                               "it to e.g. 600 (0 disables the watchdog) or unset it"));
    }
  }
}

// A process that was itself stopped (SIGSTOP, a debugger) and woken must not count the time
// it was stopped: mpirun wakes a stopped rank to end it, and its watchdog would then blame
// the others. A child runs a watchdog (1 s) over an operation, is stopped for 1.5 s, and
// reports after how long, from the operation's start, the watchdog fired.
TEST(Watchdog, TimeAStoppedProcessSpentStoppedDoesNotCount) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto record = std::make_shared<CommRecord>();
    std::atomic<double> fired_after{-1};
    double t0 = now_seconds();
    WatchdogOptions o;
    o.timeout_s = 1.0;
    o.on_timeout = [&](const std::string&) { fired_after = now_seconds() - t0; };
    auto wd = std::make_unique<Watchdog>(record, 0, o);
    record->start("all_reduce", "world", 8, 1);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(2);
    while (fired_after < 0 && now_seconds() - t0 < 10) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int tenths = int(std::min(fired_after.load() * 10, 250.0));
    wd.reset();  // its thread ends before the process does (a leak report would set the status)
    _exit(tenths);
  }
  close(ready[1]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  kill(child, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  kill(child, SIGCONT);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  // Without the correction it fires at once when woken (~1.5 s); with it, 1 s after (~2.5 s).
  EXPECT_GE(WEXITSTATUS(status), 22) << "fired " << WEXITSTATUS(status) / 10.0 << " s after the start";
  EXPECT_LT(WEXITSTATUS(status), 60);
}

TEST(Watchdog, TimeoutFromEnvironment) {
  ::setenv("LOOM_COMM_TIMEOUT", "2.5", 1);
  EXPECT_EQ(watchdog_timeout_from_env(600), 2.5);
  ::setenv("LOOM_COMM_TIMEOUT", "soon", 1);
  EXPECT_THROW(watchdog_timeout_from_env(600), Error);
  ::unsetenv("LOOM_COMM_TIMEOUT");
  EXPECT_EQ(watchdog_timeout_from_env(600), 600);
}
