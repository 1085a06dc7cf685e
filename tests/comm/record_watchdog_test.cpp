// CommRecord bounds, Chrome trace output and the watchdog's detection and message, in one
// process (the multi-rank abort is tested by tests/comm/watchdog_test.sh under mpiexec).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <thread>

#include "loom/comm/record.h"
#include "loom/comm/watchdog.h"
#include "loom/core/error.h"
#include "loom/core/timer.h"

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

TEST(CommRecord, ChromeTraceHasOneCompleteEventPerOperation) {
  CommRecord r;
  r.finish(r.start("all_gather", "tp", 2048, 7), true);
  r.start("send", "pp\"x", 8, 1);  // still running; the quote must be escaped
  std::ostringstream os;
  write_chrome_trace(r, 3, os);
  std::string s = os.str();
  EXPECT_EQ(s.rfind("{\"traceEvents\":[", 0), 0u);
  EXPECT_NE(s.find("\"name\":\"all_gather\",\"pid\":3"), std::string::npos) << s;
  EXPECT_NE(s.find("\"seq\":7,\"bytes\":2048,\"state\":\"completed\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"state\":\"in_flight\""), std::string::npos) << s;
  EXPECT_NE(s.find("pp\\\"x"), std::string::npos) << s;
  EXPECT_NE(s.find("\"ph\":\"M\""), std::string::npos) << s;
}

TEST(Watchdog, MessageNamesRankGroupOpAndLastCompleted) {
  CommEvent stuck{"all_reduce", "dp", 4 << 20, 17, 0, 0, OpState::in_flight};
  CommEvent last{"all_reduce", "dp", 4 << 20, 16, 0, 1, OpState::completed};
  EXPECT_EQ(watchdog_message(1, stuck, 3.04, last),
            "[watchdog] rank 1: all_reduce #17 on group dp (4.00 MiB) has not completed after "
            "3.0 s; last completed: all_reduce #16. A peer rank may have died or be stuck.");
  EXPECT_NE(watchdog_message(0, stuck, 1, std::nullopt).find("last completed: none."),
            std::string::npos);
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

  Stopwatch sw;
  record->start("all_gather", "world", 1000, 4);
  while (fired.load() == 0 && sw.seconds() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  double t = sw.seconds();
  EXPECT_EQ(fired.load(), 1);
  EXPECT_GE(t, 0.29);
  EXPECT_LT(t, 1.5);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_NE(message.find("[watchdog] rank 2: all_gather #4 on group world"), std::string::npos) << message;
  EXPECT_NE(message.find("last completed: barrier #3."), std::string::npos) << message;
  EXPECT_TRUE(wd.fired());
}

TEST(Watchdog, TimeoutFromEnvironment) {
  ::setenv("LOOM_COMM_TIMEOUT", "2.5", 1);
  EXPECT_EQ(watchdog_timeout_from_env(600), 2.5);
  ::setenv("LOOM_COMM_TIMEOUT", "soon", 1);
  EXPECT_THROW(watchdog_timeout_from_env(600), Error);
  ::unsetenv("LOOM_COMM_TIMEOUT");
  EXPECT_EQ(watchdog_timeout_from_env(600), 600);
}
