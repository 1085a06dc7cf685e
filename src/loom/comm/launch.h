// Launch-side helpers: where a process sits in a job (from the variables launchers set),
// and the pure parts of `loom launch` (the mpirun or srun command line, their output tags)
// so they can be tested without starting processes.
// Library loom_comm_mpi (the part of comm that links MPI; src/CMakeLists.txt).
#pragma once
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace loom::comm {

// LaunchEnv::source of a task that srun started (a job step's SLURM_PROCID and
// SLURM_STEP_NUM_TASKS; the batch script itself has no step, so it is no rank).
inline constexpr const char* kSlurmSource = "SLURM_PROCID/SLURM_STEP_NUM_TASKS";

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_size = 1;
  // Which variables said so: "OMPI_COMM_WORLD_*", kSlurmSource, "PMI_*", "RANK/WORLD_SIZE",
  // or "" when no launcher set any (a plain single process).
  std::string source;
  bool under_mpi = false;  // started by an MPI launcher, so MPI_Init will find its peers
  // Under srun: the MPI plugin it was given (SLURM_MPI_TYPE: pmix, pmi2, ...; "" for none).
  // Only pmix makes under_mpi: Open MPI as Debian builds it takes its peers from PMIx alone.
  std::string slurm_mpi;
  bool launched() const { return !source.empty(); }
  bool under_srun() const { return source == kSlurmSource; }
  // Only one rank draws progress bars and prints summaries.
  bool is_primary() const { return rank == 0; }
};

using EnvLookup = std::function<const char*(const char*)>;
// Reads OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, then srun's SLURM_PROCID,
// SLURM_STEP_NUM_TASKS, SLURM_LOCALID and SLURM_STEP_TASKS_PER_NODE, then PMI_RANK/PMI_SIZE
// (MPICH), then RANK/WORLD_SIZE/LOCAL_RANK (torchrun style). Throws naming the variable when
// a value is not an integer or the rank is outside the world size.
LaunchEnv launch_env(const EnvLookup& getenv_fn = [](const char* n) { return std::getenv(n); });

// Tasks on node `node` of a Slurm tasks-per-node list: "2(x3),1" -> 2 for nodes 0-2, 1 for
// node 3. Throws naming the list when it is malformed or has no such node.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);
// Why a task srun started cannot join its peers, naming the fix; "" when it can (or when
// srun did not start it, or started it alone). srun without --mpi=pmix gives Open MPI no
// peers: every task would fail in MPI_Init or train alone.
std::string srun_mpi_problem(const LaunchEnv& env);

// What `loom launch` starts its ranks with: mpirun anywhere, srun inside a Slurm allocation.
enum class Launcher { mpirun, srun };

struct LaunchOptions {
  Launcher launcher = Launcher::mpirun;
  int nproc = 1;
  std::string hosts;        // "h1:4,h2:4" (mpirun --host); its slots must add up to nproc
  std::string hostfile;     // mpirun --hostfile
  std::string agent;        // how mpirun starts its daemons on the hosts (plm_rsh_agent; ssh)
  std::string net;          // CIDR the ranks and daemons talk over (btl/oob_tcp_if_include)
  bool test_hosts = false;  // namespace hosts: shared memory inside a host, TCP between
  double timeout_s = -1;    // > 0: the ranks' watchdog timeout (LOOM_COMM_TIMEOUT)
  std::string mpirun = "mpirun";
  std::string srun = "srun";
  int allocation_tasks = 0;            // srun: the allocation's tasks (SLURM_NTASKS); 0 when unknown
  std::string exe;                     // the binary every rank runs
  std::vector<std::string> args;       // its arguments
  int local_cores = 1;                 // cores of this machine, for --oversubscribe
  bool as_root = false;                // add --allow-run-as-root
  std::vector<std::string> env_names;  // variables set here; the forwarded ones get -x
};

// The variables `loom launch` passes on to every rank: LOOM_*, OMP_*, PATH, LD_LIBRARY_PATH.
bool is_forwarded_env(const std::string& name);
// Slots named by a --hosts list: "h1:4,h2:4" -> 8; a host without ":n" counts as 1.
int slots_in_hosts(const std::string& hosts);
// The host names of a --hosts list, in order: "h1:4,h2" -> {h1, h2}.
std::vector<std::string> host_names(const std::string& hosts);
// The full argv for mpirun. Throws on nproc < 1, both hosts and hostfile, or hosts whose
// slots do not add up to nproc.
std::vector<std::string> mpirun_command(const LaunchOptions& opts);
// The full argv for srun inside an allocation: nproc tasks in blocks (consecutive ranks
// share a node, so tp stays inside one), PMIx, every task ended when one fails, output
// labelled with the task. Throws on nproc < 1, nproc above allocation_tasks, or options
// that only mpirun has (hosts, hostfile, agent, net).
std::vector<std::string> srun_command(const LaunchOptions& opts);
// mpirun_command or srun_command, as opts.launcher says.
std::vector<std::string> launch_command(const LaunchOptions& opts);

// Test hosts: network namespaces on this machine made by scripts/testhosts.sh, reached
// through its agent instead of ssh. `testhosts.sh up` describes them in this file.
inline constexpr const char* kTestHostsStatePath = "/run/loom-testhosts/state";
inline constexpr const char* kTestHostPrefix = "loomh";
struct TestHosts {
  std::vector<std::string> hosts;  // loomh1 loomh2 ...
  std::string agent;               // "/path/scripts/testhosts.sh agent"
  std::string net;                 // 198.18.0.0/24
};
// Parses the state file's `key=value` lines (hosts, agent, net; # comments). Throws naming
// the file and the missing key.
TestHosts parse_test_hosts(const std::string& text, const std::string& path = kTestHostsStatePath);
// When every host of opts.hosts is a test host, sets opts.agent, net and test_hosts (an
// agent given explicitly is left alone). Throws, naming the host, when only some are, or
// when a name looks like a test host (loomh<N>) but none are up (`up` is nullopt).
void use_test_hosts(LaunchOptions& opts, const std::optional<TestHosts>& up);

// One line of `mpirun --tag-output` output: "[1,3]<stdout>:text". rank is -1 for lines
// mpirun printed itself (no tag); text is then the whole line. A line its rank wrote in
// pieces has the tag before each piece; text is the pieces joined.
struct TaggedLine {
  int rank = -1;
  bool is_stderr = false;
  std::string text;
};
TaggedLine parse_tagged_line(const std::string& line);
// One line of `srun --label` output: "3: text" (the number padded to the widest task's).
// rank is -1 for lines srun printed itself ("srun: error: ..."). srun puts a task's
// standard error on its own, so the stream says which it was.
TaggedLine parse_srun_line(const std::string& line, bool is_stderr);
// How `loom launch` shows a rank's line: "[rank 3] text"; untagged lines unchanged.
std::string format_rank_line(const TaggedLine& line);

}  // namespace loom::comm
