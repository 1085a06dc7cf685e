// The step-trace recorder: off records nothing, spans nest, the cap holds, threads append
// safely, and the file is JSON Perfetto accepts (rows that nest, metadata with the offset).
#include "loom/core/trace.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "loom/core/timer.h"

using namespace loom;
using nlohmann::json;

namespace {

// Each test starts and stops the process-wide recorder itself.
struct TraceTest : ::testing::Test {
  void TearDown() override { trace::stop(); }
};

json written(int rank = 0) {
  std::ostringstream os;
  trace::write_json(os, {rank, 2, "train x.yaml"});
  return json::parse(os.str());
}

std::vector<json> complete_events(const json& doc) {
  std::vector<json> out;
  for (const json& e : doc.at("traceEvents"))
    if (e.at("ph") == "X") out.push_back(e);
  return out;
}

// The first pair of one row's events (sorted by start) that overlap without nesting, as text;
// empty when every event starts after each earlier one ends or ends inside it (1e-3 us slack).
std::string first_unnested(const std::vector<json>& row) {
  for (size_t i = 1; i < row.size(); ++i) {
    const double s = row[i].at("ts"), e = s + row[i].at("dur").get<double>();
    for (size_t j = 0; j < i; ++j) {
      const double ps = row[j].at("ts"), pe = ps + row[j].at("dur").get<double>();
      if (!(s >= pe - 1e-3 || (s >= ps && e <= pe + 1e-3))) return row[i].dump() + " overlaps " + row[j].dump();
    }
  }
  return "";
}

TEST_F(TraceTest, OffRecordsNothing) {
  trace::start();
  trace::stop();
  EXPECT_FALSE(trace::enabled());
  {
    trace::Span s("forward block", "compute", {{"layer", 0}});
    trace::record("x", "compute", 1.0, 2.0);
    trace::record_on_track("comm world", "all_reduce", "comm", 1.0, 2.0, {{"bytes", 8}});
  }
  EXPECT_TRUE(trace::events().empty());
  EXPECT_EQ(trace::dropped(), 0u);
}

TEST_F(TraceTest, SpansNestOnTheirThread) {
  trace::start();
  {
    trace::Span outer("train step", "step", {{"step", 7}});
    trace::Span inner("forward block", "compute", {{"layer", 3}, {"micro", 1}});
  }
  const auto ev = trace::events();
  ASSERT_EQ(ev.size(), 2u);
  const trace::Event& inner = ev[0];  // ended first
  const trace::Event& outer = ev[1];
  EXPECT_EQ(inner.name, "forward block");
  EXPECT_EQ(outer.name, "train step");
  EXPECT_EQ(inner.tid, outer.tid);
  EXPECT_GE(inner.start_s, outer.start_s);
  EXPECT_LE(inner.start_s + inner.duration_s, outer.start_s + outer.duration_s);
  ASSERT_EQ(inner.n_args, 2);
  EXPECT_STREQ(inner.args[0].key, "layer");
  EXPECT_EQ(inner.args[0].value, 3);
  EXPECT_EQ(outer.args[0].value, 7);
}

TEST_F(TraceTest, StartForgetsTheLastRecording) {
  trace::start();
  trace::record("a", "compute", 1.0, 2.0);
  trace::start();
  EXPECT_TRUE(trace::events().empty());
}

TEST_F(TraceTest, KeepsAtMostTheCapAndCountsTheRest) {
  trace::start(5);
  for (int i = 0; i < 8; ++i) trace::record("e", "compute", i, i + 0.5);
  EXPECT_EQ(trace::events().size(), 5u);
  EXPECT_EQ(trace::event_count(), 5u);
  EXPECT_EQ(trace::dropped(), 3u);
  EXPECT_EQ(written().at("metadata").at("dropped"), 3);
}

TEST_F(TraceTest, ThreadsAppendSafelyEachOnItsOwnTid) {
  trace::start();
  constexpr int kThreads = 4, kEach = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < kEach; ++i) trace::Span s("work", "compute", {{"i", i}});
    });
  for (auto& th : threads) th.join();
  const auto ev = trace::events();
  ASSERT_EQ(ev.size(), size_t(kThreads * kEach));
  std::set<int> tids;
  for (const auto& e : ev) tids.insert(e.tid);
  EXPECT_EQ(tids.size(), size_t(kThreads));
}

TEST_F(TraceTest, WritesChromeJsonWithRowsThatNest) {
  trace::start();
  trace::set_clock_offset(-0.0015, 0.00002);
  const double t = now_seconds();
  trace::record("forward block", "compute", t, t + 0.010, {{"layer", 1}});
  trace::record("head+loss", "compute", t + 0.002, t + 0.004);
  // Two transfers of one group that overlap without nesting, and one inside the first.
  trace::record_on_track("comm pp", "recv", "comm", t, t + 0.006, {{"bytes", 4096}});
  trace::record_on_track("comm pp", "recv", "comm", t + 0.003, t + 0.009, {{"bytes", 4096}});
  trace::record_on_track("comm pp", "send \"x\"", "comm", t + 0.001, t + 0.002, {{"bytes", 64}});
  const json doc = written(1);

  const json& meta = doc.at("metadata");
  EXPECT_EQ(meta.at("rank"), 1);
  EXPECT_EQ(meta.at("world_size"), 2);
  EXPECT_NEAR(meta.at("clock_offset_us").get<double>(), -1500.0, 1e-6);
  EXPECT_NEAR(meta.at("clock_rtt_us").get<double>(), 20.0, 1e-6);
  EXPECT_EQ(meta.at("command"), "train x.yaml");

  const auto ev = complete_events(doc);
  ASSERT_EQ(ev.size(), 5u);
  std::map<int, std::vector<json>> by_tid;
  double last_ts = -1;
  for (const json& e : ev) {
    EXPECT_EQ(e.at("pid"), 1);
    EXPECT_GE(e.at("ts").get<double>(), last_ts) << "events sorted by start";
    last_ts = e.at("ts").get<double>();
    by_tid[e.at("tid").get<int>()].push_back(e);
  }
  // The thread's two spans share a row; the overlapping recv gets a row of its own.
  EXPECT_EQ(by_tid.size(), 3u);
  for (const auto& [tid, row] : by_tid) EXPECT_EQ(first_unnested(row), "") << "row " << tid;
  bool saw_bytes = false;
  for (const json& e : ev)
    if (e.at("name") == "send \"x\"") saw_bytes = e.at("args").at("bytes") == 64;
  EXPECT_TRUE(saw_bytes);
  EXPECT_NEAR(ev.front().at("dur").get<double>(), 10000.0, 1e-3);

  std::set<std::string> names;
  for (const json& e : doc.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names.insert(e.at("args").at("name"));
  EXPECT_TRUE(names.count("main"));
  EXPECT_TRUE(names.count("comm pp"));
  EXPECT_TRUE(names.count("comm pp (2)"));
}

// The nesting check above rejects a row where an event overlaps one earlier event partially,
// even when it starts after another (a check that ORs over earlier events would accept it).
TEST(TraceJson, NestingCheckRejectsAPartialOverlap) {
  auto ev = [](double ts, double dur) { return json{{"ts", ts}, {"dur", dur}}; };
  EXPECT_EQ(first_unnested({ev(0, 6000), ev(1000, 1000), ev(5000, 1000)}), "");
  EXPECT_EQ(first_unnested({ev(0, 6000), ev(6000, 3000)}), "");
  EXPECT_NE(first_unnested({ev(0, 6000), ev(1000, 1000), ev(3000, 6000)}), "");
}

TEST(TraceJson, EscapesWhatJsonCannotHold) { EXPECT_EQ(trace::json_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\u000ad"); }

}  // namespace
