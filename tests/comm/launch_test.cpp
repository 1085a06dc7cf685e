// The pure parts of launching: reading launcher variables, the mpirun command line of
// `loom launch` (host lists, agents, test hosts), and the parsing of Open MPI's tagged output.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "testing/errors.h"

using namespace loom;
using namespace loom::comm;
using loom::testing::error_of;

namespace {

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

bool has_pair(const std::vector<std::string>& v, const std::string& a, const std::string& b) {
  for (size_t i = 0; i + 1 < v.size(); ++i)
    if (v[i] == a && v[i + 1] == b) return true;
  return false;
}

bool has(const std::vector<std::string>& v, const std::string& a) {
  return std::find(v.begin(), v.end(), a) != v.end();
}

}  // namespace

TEST(LaunchEnv, ReadsOpenMpiThenTorchrunVariables) {
  LaunchEnv none = launch_env(fake_env({}));
  EXPECT_FALSE(none.launched());
  EXPECT_EQ(none.world_size, 1);

  LaunchEnv o = launch_env(fake_env({{"OMPI_COMM_WORLD_RANK", "3"},
                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                     {"RANK", "9"}}));
  EXPECT_TRUE(o.under_mpi);
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_FALSE(o.is_primary());

  LaunchEnv t = launch_env(fake_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}));
  EXPECT_FALSE(t.under_mpi);
  EXPECT_EQ(t.source, "RANK/WORLD_SIZE");
  EXPECT_EQ(t.world_size, 2);
  EXPECT_TRUE(t.is_primary());
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  try {
    launch_env(fake_env({{"RANK", "two"}, {"WORLD_SIZE", "4"}}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=\"two\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(launch_env(fake_env({{"RANK", "4"}, {"WORLD_SIZE", "4"}})), Error);
  EXPECT_THROW(launch_env(fake_env({{"WORLD_SIZE", "4"}})), Error);
}

TEST(LaunchCommand, OversubscribesRootAndForwardsEnvironment) {
  LaunchOptions o;
  o.nproc = 4;
  o.local_cores = 2;
  o.as_root = true;
  o.exe = "/opt/loom/bin/loom";
  o.args = {"bench", "comm"};
  o.timeout_s = 3;
  o.env_names = {"HOME", "PATH", "LOOM_DATA", "OMP_NUM_THREADS", "LD_LIBRARY_PATH", "LOOM_COMM_TIMEOUT"};
  std::vector<std::string> c = mpirun_command(o);
  EXPECT_EQ(c[0], "mpirun");
  EXPECT_TRUE(has_pair(c, "-np", "4"));
  EXPECT_TRUE(has(c, "--oversubscribe"));
  EXPECT_TRUE(has(c, "--allow-run-as-root"));
  EXPECT_TRUE(has(c, "--tag-output"));
  EXPECT_TRUE(has_pair(c, "-x", "PATH"));
  EXPECT_TRUE(has_pair(c, "-x", "LOOM_DATA"));
  EXPECT_TRUE(has_pair(c, "-x", "OMP_NUM_THREADS"));
  EXPECT_TRUE(has_pair(c, "-x", "LD_LIBRARY_PATH"));
  EXPECT_FALSE(has_pair(c, "-x", "HOME"));
  EXPECT_TRUE(has_pair(c, "-x", "LOOM_COMM_TIMEOUT=3"));
  EXPECT_FALSE(has_pair(c, "-x", "LOOM_COMM_TIMEOUT"));  // --timeout wins over the inherited one
  ASSERT_GE(c.size(), 3u);
  EXPECT_EQ(c[c.size() - 3], "/opt/loom/bin/loom");
  EXPECT_EQ(c.back(), "comm");
}

TEST(LaunchCommand, HostsMustHoldExactlyNproc) {
  LaunchOptions o;
  o.exe = "loom";
  o.nproc = 8;
  o.hosts = "a:4,b:4";
  o.local_cores = 2;
  std::vector<std::string> c = mpirun_command(o);
  EXPECT_TRUE(has_pair(c, "--host", "a:4,b:4"));
  EXPECT_FALSE(has(c, "--oversubscribe"));  // the slots given, not the local cores, count
  EXPECT_FALSE(has(c, "--allow-run-as-root"));
  EXPECT_FALSE(has(c, "--mca"));
  for (int nproc : {9, 6}) {
    o.nproc = nproc;
    EXPECT_EQ(error_of([&] { mpirun_command(o); }),
              "[launch] --hosts a:4,b:4 has 8 slots but --nproc is " + std::to_string(nproc) +
                  "; give each host the number of ranks it should run (host:ranks) so that they "
                  "add up to --nproc, or leave --nproc out");
  }
  EXPECT_EQ(slots_in_hosts("a,b:3"), 4);
  EXPECT_EQ(host_names("a,b:3,,c:1"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_THROW(slots_in_hosts("a:0"), Error);
  EXPECT_THROW(slots_in_hosts(":2"), Error);
  o.nproc = 8;
  o.hostfile = "hosts.txt";
  EXPECT_THROW(mpirun_command(o), Error);
  o.hosts.clear();
  o.nproc = 0;
  EXPECT_THROW(mpirun_command(o), Error);
}

TEST(LaunchCommand, AgentAndNetworkBecomeMcaParameters) {
  LaunchOptions o;
  o.exe = "loom";
  o.nproc = 2;
  o.hosts = "n1,n2";
  o.agent = "ssh -p 2222";
  o.net = "10.1.0.0/16";
  std::vector<std::string> c = mpirun_command(o);
  EXPECT_TRUE(has_pair(c, "plm_rsh_agent", "ssh -p 2222"));
  EXPECT_TRUE(has_pair(c, "btl_tcp_if_include", "10.1.0.0/16"));
  EXPECT_TRUE(has_pair(c, "oob_tcp_if_include", "10.1.0.0/16"));
  EXPECT_FALSE(has(c, "btl"));  // transports are mpirun's choice on real hosts
  // Every --mca takes two values, and all of them come before the program.
  auto exe = std::find(c.begin(), c.end(), "loom");
  for (auto it = c.begin(); it != c.end(); ++it)
    if (*it == "--mca") {
      EXPECT_LT(it + 2, exe);
    }
}

TEST(LaunchTestHosts, ParsesTheStateFile) {
  TestHosts t = parse_test_hosts(
      "# written by up\nhosts=loomh1 loomh2\nagent=/src/scripts/testhosts.sh agent\n"
      "net=198.18.0.0/24\nlink=1gbit\n");
  EXPECT_EQ(t.hosts, (std::vector<std::string>{"loomh1", "loomh2"}));
  EXPECT_EQ(t.agent, "/src/scripts/testhosts.sh agent");
  EXPECT_EQ(t.net, "198.18.0.0/24");
  EXPECT_EQ(error_of([] { parse_test_hosts("hosts=loomh1\nnet=198.18.0.0/24\n", "/run/x"); }),
            "[launch] /run/x has no 'agent=' line; recreate it with scripts/testhosts.sh up N");
  EXPECT_THROW(parse_test_hosts("hosts loomh1\n"), Error);
}

TEST(LaunchTestHosts, NamedTestHostsGetTheAgentAndNetwork) {
  const TestHosts up{{"loomh1", "loomh2"}, "/src/scripts/testhosts.sh agent", "198.18.0.0/24"};
  LaunchOptions o;
  o.exe = "loom";
  o.nproc = 4;
  o.hosts = "loomh1:2,loomh2:2";
  use_test_hosts(o, up);
  EXPECT_TRUE(o.test_hosts);
  std::vector<std::string> c = mpirun_command(o);
  EXPECT_TRUE(has_pair(c, "plm_rsh_agent", "/src/scripts/testhosts.sh agent"));
  EXPECT_TRUE(has_pair(c, "btl", "vader,tcp,self"));
  EXPECT_TRUE(has_pair(c, "pml", "ob1"));
  EXPECT_TRUE(has_pair(c, "btl_tcp_if_include", "198.18.0.0/24"));
  EXPECT_TRUE(has_pair(c, "oob_tcp_if_include", "198.18.0.0/24"));

  LaunchOptions own = o;  // an explicit agent is kept
  own.agent = "my-agent";
  own.test_hosts = false;
  use_test_hosts(own, up);
  EXPECT_EQ(own.agent, "my-agent");

  LaunchOptions real;  // real hosts are left to mpirun
  real.hosts = "node1:4,loomh:4";
  use_test_hosts(real, up);
  use_test_hosts(real, std::nullopt);
  EXPECT_FALSE(real.test_hosts);
  EXPECT_TRUE(real.agent.empty());
}

TEST(LaunchTestHosts, UnknownHostsAreNamed) {
  const TestHosts up{{"loomh1", "loomh2"}, "agent", "198.18.0.0/24"};
  LaunchOptions o;
  o.hosts = "loomh1:2,loomh3:2";
  EXPECT_EQ(error_of([&] { use_test_hosts(o, up); }),
            "[launch] --hosts loomh1:2,loomh3:2: loomh3 is not up (test hosts up: loomh1 loomh2); "
            "bring them up with scripts/testhosts.sh up 3, or list real hosts only");
  o.hosts = "loomh1:2,node7:2";
  EXPECT_EQ(error_of([&] { use_test_hosts(o, up); }),
            "[launch] --hosts loomh1:2,node7:2: node7 is not a test host (test hosts up: loomh1 "
            "loomh2); use only test hosts, or list real hosts only");
  o.hosts = "loomh1:2,loomh2:2";
  EXPECT_EQ(error_of([&] { use_test_hosts(o, std::nullopt); }),
            "[launch] --hosts names loomh1, loomh2, which look like test hosts, but none are up "
            "(no /run/loom-testhosts/state); create them with scripts/testhosts.sh up 2 (as root)");
  o.hosts = "loomh3:4";
  EXPECT_EQ(error_of([&] { use_test_hosts(o, std::nullopt); }),
            "[launch] --hosts names loomh3, which looks like a test host, but none are up "
            "(no /run/loom-testhosts/state); create them with scripts/testhosts.sh up 3 (as root)");
  EXPECT_TRUE(o.agent.empty());
}

TEST(LaunchOutput, RewritesOpenMpiTags) {
  TaggedLine a = parse_tagged_line("[1,3]<stdout>:loss 2.5 [ok]");
  EXPECT_EQ(a.rank, 3);
  EXPECT_FALSE(a.is_stderr);
  EXPECT_EQ(format_rank_line(a), "[rank 3] loss 2.5 [ok]");
  TaggedLine b = parse_tagged_line("[27,0]<stderr>:error: x");
  EXPECT_EQ(b.rank, 0);
  EXPECT_TRUE(b.is_stderr);
  EXPECT_EQ(b.text, "error: x");
  // A line written in pieces (streamed tokens): mpirun tags each piece.
  TaggedLine c = parse_tagged_line("[1,0]<stdout>:ROMEO: [1,0]<stdout>:t[1,0]<stdout>:he[1,0]<stdout>:");
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.text, "ROMEO: the");
  for (const char* s : {"[warn] something", "plain", "[1,x]<stdout>:y", "", "[1,2]<other>:z"}) {
    TaggedLine u = parse_tagged_line(s);
    EXPECT_EQ(u.rank, -1) << s;
    EXPECT_EQ(format_rank_line(u), s);
  }
}

// Variables as Slurm 22.05 sets them: the batch script of `sbatch -N2 --ntasks-per-node=2`,
// and task 3 of `srun` inside it (with --mpi=pmix, pmi2 or none).
namespace {
std::map<std::string, std::string> slurm_task(const std::string& mpi) {
  std::map<std::string, std::string> v = {{"SLURM_JOB_ID", "7"},         {"SLURM_NTASKS", "4"},
                                          {"SLURM_PROCID", "3"},         {"SLURM_STEP_ID", "0"},
                                          {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "1"},
                                          {"SLURM_NODEID", "1"},         {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};
  if (mpi == "pmix") v.insert({{"SLURM_MPI_TYPE", "pmix"}, {"PMIX_RANK", "3"}});
  if (mpi == "pmi2") v.insert({{"SLURM_MPI_TYPE", "pmi2"}, {"PMI_FD", "11"}, {"PMI_RANK", "3"}, {"PMI_SIZE", "4"}});
  return v;
}
}  // namespace

TEST(LaunchEnv, ReadsSrunTasksAndOnlyPmixMakesThemMpiRanks) {
  LaunchEnv p = launch_env(fake_env(slurm_task("pmix")));
  EXPECT_EQ(p.source, kSlurmSource);
  EXPECT_TRUE(p.under_srun());
  EXPECT_TRUE(p.under_mpi);
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_size, 2);
  EXPECT_EQ(srun_mpi_problem(p), "");

  // pmi2 sets PMI_RANK/PMI_SIZE too, but Open MPI cannot use it: no MPI rank, and the reason.
  LaunchEnv q = launch_env(fake_env(slurm_task("pmi2")));
  EXPECT_TRUE(q.under_srun());
  EXPECT_FALSE(q.under_mpi);
  EXPECT_EQ(q.slurm_mpi, "pmi2");
  EXPECT_NE(srun_mpi_problem(q).find("task 3 of 4 with --mpi=pmi2 (SLURM_MPI_TYPE), which gives Open MPI no peers"),
            std::string::npos)
      << srun_mpi_problem(q);
  EXPECT_NE(srun_mpi_problem(q).find("Run srun --mpi=pmix"), std::string::npos);
  LaunchEnv n = launch_env(fake_env(slurm_task("none")));
  EXPECT_NE(srun_mpi_problem(n).find("without an MPI plugin (srun --mpi=none"), std::string::npos)
      << srun_mpi_problem(n);

  // One task alone needs no peers.
  auto one = slurm_task("none");
  one["SLURM_PROCID"] = "0", one["SLURM_STEP_NUM_TASKS"] = "1", one["SLURM_STEP_TASKS_PER_NODE"] = "1";
  one["SLURM_NODEID"] = "0";
  EXPECT_EQ(srun_mpi_problem(launch_env(fake_env(one))), "");

  // The batch script has SLURM_PROCID=0 but no step: a plain process, not rank 0 of 4.
  auto batch = slurm_task("none");
  for (const char* k : {"SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_LOCALID"})
    batch.erase(k);
  batch["SLURM_PROCID"] = "0";
  LaunchEnv b = launch_env(fake_env(batch));
  EXPECT_FALSE(b.launched());
  EXPECT_EQ(b.world_size, 1);

  // mpirun inside an allocation: its ranks carry the daemons' step, but Open MPI's count.
  auto m = slurm_task("none");
  m.insert({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}});
  LaunchEnv o = launch_env(fake_env(m));
  EXPECT_EQ(o.source, "OMPI_COMM_WORLD_*");
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(srun_mpi_problem(o), "");
}

TEST(LaunchEnv, SlurmTasksPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("2(x2)", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x2)", 1), 2);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 2), 1);
  EXPECT_EQ(slurm_tasks_on_node("4,2,1", 1), 2);
  EXPECT_EQ(error_of([] { slurm_tasks_on_node("2(x2)", 2); }),
            "[launch] SLURM_STEP_TASKS_PER_NODE=\"2(x2)\" names 2 nodes but SLURM_NODEID is 2");
  for (const char* bad : {"2(2)", "x", "2(x0)", "2,", "2(x2"})
    EXPECT_NE(error_of([&] { slurm_tasks_on_node(bad, 0); }).find("is not N or N(xM)"), std::string::npos) << bad;
}

TEST(LaunchCommand, SrunStartsBlocksOfTasksWithPmix) {
  LaunchOptions o;
  o.launcher = Launcher::srun;
  o.nproc = 4;
  o.allocation_tasks = 4;
  o.exe = "/opt/loom/bin/loom";
  o.args = {"train", "c.yaml"};
  o.timeout_s = 30;
  const std::vector<std::string> c = launch_command(o);
  const std::vector<std::string> want = {"srun",
                                         "--ntasks=4",
                                         "--mpi=pmix",
                                         "--kill-on-bad-exit=1",
                                         "--distribution=block",
                                         "--label",
                                         "--export=ALL,LOOM_COMM_TIMEOUT=30",
                                         "/opt/loom/bin/loom",
                                         "train",
                                         "c.yaml"};
  EXPECT_EQ(c, want);
  o.nproc = 8;
  EXPECT_EQ(error_of([&] { srun_command(o); }),
            "[launch] --nproc 8 is more than the allocation's 4 tasks (SLURM_NTASKS); ask sbatch for --ntasks=8 (or "
            "--nodes and --ntasks-per-node that multiply to it), or give --nproc 4");
  o.nproc = 4;
  o.hosts = "a:2,b:2";
  EXPECT_NE(error_of([&] { srun_command(o); }).find("[launch] --hosts is for mpirun"), std::string::npos);
}

TEST(LaunchOutput, ReadsSrunLabels) {
  TaggedLine a = parse_srun_line("3: step 4/12 | loss 2.5", false);
  EXPECT_EQ(a.rank, 3);
  EXPECT_FALSE(a.is_stderr);
  EXPECT_EQ(format_rank_line(a), "[rank 3] step 4/12 | loss 2.5");
  TaggedLine b = parse_srun_line(" 0: error: x", true);  // padded to the widest label (10+ tasks)
  EXPECT_EQ(b.rank, 0);
  EXPECT_TRUE(b.is_stderr);
  EXPECT_EQ(b.text, "error: x");
  EXPECT_EQ(parse_srun_line("12: ", false).text, "");
  for (const char* s : {"srun: error: loomh2: task 3: Killed", "plain", "3 apples", "", ": x", "3:x"}) {
    TaggedLine u = parse_srun_line(s, true);
    EXPECT_EQ(u.rank, -1) << s;
    EXPECT_EQ(format_rank_line(u), s);
  }
}
