// The pure parts of elastic restarts (comm/elastic.h): failure causes read from real Open MPI
// 4.1 and watchdog lines, restart arguments, and which ranks or hosts a shrink drops.
#include <gtest/gtest.h>

#include "loom/comm/elastic.h"
#include "loom/core/error.h"

using namespace loom::comm;

TEST(Elastic, ReadsTheCauseFromMpirunAndWatchdogLines) {
  FailureCause c;
  note_failure_line("mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed).", c);
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.what, "exited on signal 9 (Killed)");
  EXPECT_FALSE(c.hang);

  FailureCause e;  // a non-zero exit: the process name first, its code on a later line
  note_failure_line("  Process name: [[10848,1],1]", e);
  note_failure_line("  Exit code:    3", e);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.what, "exit code 3");

  FailureCause h;  // a hang: the watchdog's verdict wins over what mpirun says of the abort
  note_failure_line(
      "[rank 0] [watchdog] rank 0: all_gather #7092 on group world (2.00 KiB) has not completed after "
      "5.2 s; last completed: all_gather #7091. Every rank entered it, but rank 1 is now stopped.",
      h);
  note_failure_line("MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD with errorcode 124.", h);
  EXPECT_TRUE(h.hang);
  EXPECT_EQ(h.rank, 0);
  EXPECT_NE(h.what.find("all_gather #7092"), std::string::npos) << h.what;

  FailureCause a;
  note_failure_line("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD with errorcode 1.", a);
  EXPECT_EQ(a.rank, 3);
  EXPECT_EQ(a.what, "called MPI_Abort with code 1");

  FailureCause p;  // a configuration error fails every attempt the same way
  note_failure_line("[rank 0] error: [config] parallel.tp=3 does not divide n_head=8", p);
  EXPECT_TRUE(p.permanent);
  EXPECT_FALSE(p.diverged);
  for (const char* line : {"[rank 0] error: [train] training diverged: the smoothed loss 80 has stayed ...",
                           "[rank 1] error: [train] training stopped on non-finite values: 11 steps in a row ..."}) {
    FailureCause d;  // a diverged run would diverge again
    note_failure_line(line, d);
    EXPECT_TRUE(d.diverged) << line;
    EXPECT_TRUE(d.permanent) << line;
    EXPECT_EQ(d.what.rfind("training ", 0), 0u) << d.what;
    note_failure_line("process rank 1 with PID 77 on node h exited on signal 9 (Killed)", d);
    EXPECT_TRUE(d.diverged) << "mpirun's teardown after a divergence hid it";
  }
  FailureCause s;  // srun names the task that ended first, then those --kill-on-bad-exit ended
  note_failure_line("srun: error: loomh2: task 3: Exited with exit code 1", s);
  note_failure_line("srun: error: loomh1: tasks 0-1: Killed", s);
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.what, "exited with exit code 1");
  FailureCause k;
  note_failure_line("srun: error: loomh1: task 1: Killed", k);
  EXPECT_EQ(k.rank, 1);
  EXPECT_EQ(k.what, "killed");
  FailureCause l;  // a job started in a way it cannot run: srun without PMIx, a wrong task count
  note_failure_line("[rank 2] [launch] srun started 4 tasks but pp=1 x dp=2 x ep=1 x tp=1 = 2 ranks; ...", l);
  EXPECT_TRUE(l.permanent);
  FailureCause w;
  note_failure_line("[rank 0] error: [launch] SLURM_STEP_NUM_TASKS is set but SLURM_PROCID is not", w);
  EXPECT_TRUE(w.permanent);

  FailureCause q;
  note_failure_line("[rank 1] step 12/100 | loss 2.1", q);
  EXPECT_EQ(q.rank, -1);
  EXPECT_TRUE(q.what.empty());
}

TEST(Elastic, RestartsTrainWithResumeAutoAndNeverOverwrites) {
  const std::vector<std::string> args = {"train",         "c.yaml",         "--overwrite-checkpoints",
                                         "--resume",      "ck/step_000010", "--set",
                                         "parallel.dp=4", "--set",          "optim.lr=1e-3"};
  EXPECT_EQ(restart_args(args, false), (std::vector<std::string>{"train", "c.yaml", "--set", "parallel.dp=4", "--set",
                                                                 "optim.lr=1e-3", "--resume", "auto"}));
  EXPECT_EQ(restart_args(args, true), (std::vector<std::string>{"train", "c.yaml", "--set", "optim.lr=1e-3", "--resume",
                                                                "auto", "--set", "parallel.dp=auto"}));
  const std::vector<std::string> other = {"bench", "comm", "--resume", "x"};
  EXPECT_EQ(restart_args(other, true), other);
}

TEST(Elastic, ShrinksToADivisorAndMapsRanksToHosts) {
  EXPECT_EQ(shrink_nproc(4, 2), 2);
  EXPECT_EQ(shrink_nproc(4, 3), -1);  // 3 ranks would not divide what 4 divided
  EXPECT_EQ(shrink_nproc(6, 2), 3);
  EXPECT_EQ(shrink_nproc(8, 1), 4);
  EXPECT_EQ(shrink_nproc(1, 1), -1);
  const auto hosts = parse_host_slots("loomh1:2,loomh2:2,loomh3");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[2].slots, 1);
  EXPECT_EQ(host_of_rank(hosts, 0), "loomh1");
  EXPECT_EQ(host_of_rank(hosts, 3), "loomh2");
  EXPECT_EQ(host_of_rank(hosts, 4), "loomh3");
  EXPECT_EQ(host_of_rank(hosts, 5), "");
  EXPECT_EQ(format_host_slots(hosts), "loomh1:2,loomh2:2,loomh3:1");
  EXPECT_THROW(parse_host_slots("h1:0"), loom::Error);
}
