// The progress board without MPI: several "ranks" are several boards over one plain buffer,
// as the ranks of a host are over one shared-memory object. Also the /proc reading that says
// whether a peer's process is stopped or gone, and the watchdog naming the rank that did not
// enter a collective. The board in shared memory under mpirun is tested by
// tests/comm/mpi/progress_board_mpi_test.cpp and tests/comm/train_timeout_test.sh.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "loom/comm/progress_board.h"
#include "loom/comm/watchdog.h"
#include "loom/core/error.h"
#include "loom/core/timer.h"

using namespace loom;
using namespace loom::comm;

namespace {

// One host's board memory, and a board per simulated rank over it.
struct FakeHost {
  explicit FakeHost(int world_size)
      : words(ProgressBoard::bytes_for(world_size) / sizeof(uint64_t) + 1, 0), size(world_size) {}
  std::unique_ptr<ProgressBoard> rank(int r, int64_t pid = int64_t(getpid())) {
    ProcessIdentity id;
    id.pid = pid;
    id.host = 42;
    std::shared_ptr<void> memory(words.data(), [](void*) {});  // the host owns the words
    return std::make_unique<ProgressBoard>(memory, size, r, id);
  }
  std::vector<uint64_t> words;
  int size;
};

}  // namespace

TEST(ProgressBoard, KeysAgreeAcrossMembersAndDifferBetweenGroups) {
  FakeHost host(3);
  auto b0 = host.rank(0), b1 = host.rank(1), b2 = host.rank(2);
  ProgressBoard::Lane a0 = b0->join("dp", {0, 1}), a1 = b1->join("dp", {0, 1});
  EXPECT_NE(a0.key, 0u);
  EXPECT_EQ(a0.key, a1.key);
  EXPECT_GE(a0.index, 0);
  // Same name, other members: another group.
  ProgressBoard::Lane c1 = b1->join("dp", {1, 2}), c2 = b2->join("dp", {1, 2});
  EXPECT_EQ(c1.key, c2.key);
  EXPECT_NE(c1.key, a1.key);
  // The same name and members made again (split twice): told apart, and alike on both.
  ProgressBoard::Lane d0 = b0->join("dp", {0, 1}), d1 = b1->join("dp", {0, 1});
  EXPECT_EQ(d0.key, d1.key);
  EXPECT_NE(d0.key, a0.key);
  // Not a member: nothing to track.
  ProgressBoard::Lane none = b2->join("dp", {0, 1});
  EXPECT_EQ(none.index, -1);
  EXPECT_EQ(none.key, 0u);
}

TEST(ProgressBoard, PeersShowTheLastCollectiveEachStarted) {
  FakeHost host(4);  // rank 3 never writes its slot, like a rank on another host
  auto b0 = host.rank(0), b1 = host.rank(1), b2 = host.rank(2);
  const std::vector<int> all = {0, 1, 2, 3};
  ProgressBoard::Lane l0 = b0->join("world", all), l1 = b1->join("world", all);
  b2->join("world", all);
  for (uint64_t s = 1; s <= 16; ++s) {
    b1->started(l1.index, "all_reduce", s);
    b1->completed(l1.index, "all_reduce", s);
  }
  b0->started(l0.index, "all_reduce", 17);
  std::optional<std::vector<PeerProgress>> peers = b0->peers(l0.key);
  ASSERT_TRUE(peers.has_value());
  ASSERT_EQ(peers->size(), 3u);  // every member but this rank
  const PeerProgress &p1 = (*peers)[0], &p2 = (*peers)[1], &p3 = (*peers)[2];
  EXPECT_EQ(p1.rank, 1);
  EXPECT_TRUE(p1.visible);
  EXPECT_TRUE(p1.knows_group);
  EXPECT_EQ(p1.last_started_op, "all_reduce");
  EXPECT_EQ(p1.last_started_seq, 16u);
  EXPECT_EQ(p1.pid, int64_t(getpid()));
  EXPECT_EQ(p1.process, ProcessState::running);  // same host: read from /proc
  EXPECT_EQ(p2.rank, 2);
  EXPECT_TRUE(p2.knows_group);
  EXPECT_EQ(p2.last_started_seq, 0u);
  EXPECT_EQ(p2.last_started_op, "");
  EXPECT_EQ(p3.rank, 3);
  EXPECT_FALSE(p3.visible);
  // Rank 1 sees rank 0 in #17.
  auto from1 = b1->peers(l1.key);
  ASSERT_TRUE(from1.has_value());
  EXPECT_EQ((*from1)[0].last_started_seq, 17u);
  EXPECT_FALSE(b0->peers(0).has_value());
  EXPECT_FALSE(b0->peers(l0.key + 1).has_value());
}

TEST(ProgressBoard, AFullTableIsReportedAndLeavingFreesALane) {
  FakeHost host(2);
  auto b0 = host.rank(0), b1 = host.rank(1);
  std::vector<ProgressBoard::Lane> lanes;
  for (int i = 0; i < ProgressBoard::kLanes; ++i) lanes.push_back(b1->join(str_cat("g", i), {0, 1}));
  for (const auto& l : lanes) EXPECT_GE(l.index, 0);
  ProgressBoard::Lane over1 = b1->join("over", {0, 1}), over0 = b0->join("over", {0, 1});
  EXPECT_EQ(over1.index, -1);
  EXPECT_EQ(over1.key, over0.key);  // still a key, so the watchdog can read the others
  auto peers = b0->peers(over0.key);
  ASSERT_TRUE(peers.has_value());
  EXPECT_FALSE((*peers)[0].knows_group);
  EXPECT_TRUE((*peers)[0].table_full);
  b1->leave(lanes[5]);
  EXPECT_EQ(b1->join("again", {0, 1}).index, lanes[5].index);
}

TEST(ProcessState, ParsesProcStat) {
  // Field 22 (starttime) is 777; the command name holds a space and a parenthesis.
  auto stat = [](char state, int start) {
    return str_cat("4242 (lo) om) ", state, " 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 ", start, " 23 24\n");
  };
  EXPECT_EQ(parse_proc_stat(stat('T', 777), 777), ProcessState::stopped);
  EXPECT_EQ(parse_proc_stat(stat('t', 777), 0), ProcessState::stopped);
  EXPECT_EQ(parse_proc_stat(stat('S', 777), 777), ProcessState::running);
  EXPECT_EQ(parse_proc_stat(stat('R', 777), 0), ProcessState::running);
  EXPECT_EQ(parse_proc_stat(stat('Z', 777), 777), ProcessState::gone);
  EXPECT_EQ(parse_proc_stat(stat('S', 778), 777), ProcessState::gone);  // pid reused
  EXPECT_EQ(parse_proc_stat("garbage", 0), ProcessState::unknown);
  EXPECT_EQ(parse_proc_stat("1 (x) S 1 2", 0), ProcessState::unknown);
  EXPECT_EQ(process_state(0, 0), ProcessState::unknown);
  EXPECT_NE(ProcessIdentity::self().start_time, 0u);
}

TEST(ProcessState, SeesAStoppedChildAndThenAGoneOne) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    for (;;) pause();
  }
  EXPECT_EQ(process_state(child, 0), ProcessState::running);
  kill(child, SIGSTOP);
  int status = 0;
  waitpid(child, &status, WUNTRACED);
  EXPECT_TRUE(WIFSTOPPED(status));
  EXPECT_EQ(process_state(child, 0), ProcessState::stopped);
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  EXPECT_EQ(process_state(child, 0), ProcessState::gone);
}

TEST(Watchdog, NamesTheRankThatDidNotEnterTheCollective) {
  FakeHost host(2);
  std::shared_ptr<ProgressBoard> b0 = host.rank(0);
  auto b1 = host.rank(1);
  ProgressBoard::Lane l0 = b0->join("world", {0, 1}), l1 = b1->join("world", {0, 1});
  b1->started(l1.index, "all_reduce", 1);
  b1->completed(l1.index, "all_reduce", 1);
  auto record = std::make_shared<CommRecord>();
  record->finish(record->start("all_reduce", "world", 8, 1, l0.key), true);
  record->start("all_reduce", "world", 8, 2, l0.key);
  b0->started(l0.index, "all_reduce", 2);

  std::atomic<bool> fired{false};
  std::string message;
  WatchdogOptions o;
  o.timeout_s = 0.2;
  o.board = b0;
  o.on_timeout = [&](const std::string& m) {
    message = m;
    fired = true;
  };
  Watchdog wd(record, 0, o);
  Stopwatch sw;
  while (!fired && sw.seconds() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fired);
  EXPECT_EQ(message, str_cat("[watchdog] rank 0: all_reduce #2 on group world (8 B) has not completed "
                             "after ",
                             message.substr(message.find("after ") + 6, 3),
                             " s; last completed: all_reduce #1. Rank 1 did not enter it (its last: "
                             "all_reduce #1; pid ",
                             getpid(), ", running)."));
}
