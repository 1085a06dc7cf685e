// `loom launch --nproc N [--hosts h:4,.. | --hostfile F] [--timeout S] [--max-restarts K
// [--min-nproc M]] -- <subcommand ...>`: starts N copies of this loom binary under mpirun and
// relays their output line by line, each prefixed with its rank. Exits with mpirun's status
// (non-zero when any rank failed; mpirun then tears the other ranks down). With --max-restarts
// the job is elastic: a failed attempt (a rank died, or the watchdog ended a hang) is restarted
// with `--resume auto`, on fewer ranks or hosts when one keeps failing and --min-nproc allows,
// and with a dropped host again once it answers; a diverged `train` (kExitDiverged) is not. Test hosts
// (scripts/testhosts.sh) are recognised from the state file their `up` writes. Inside a Slurm
// allocation (SLURM_JOB_ID) the ranks start with srun --mpi=pmix instead, on the allocation's
// nodes and by default as many as its tasks.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "loom/comm/elastic.h"
#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/core/exit_status.h"
#include "tools/loom/commands.h"

extern char** environ;

namespace loom::cli {

namespace {

// The child's pid, for forwarding SIGTERM; a signal handler can reach nothing else.
volatile sig_atomic_t g_child_pid = 0;

void forward_signal(int sig) {
  if (g_child_pid > 0) kill(pid_t(g_child_pid), sig);
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += size_t(n);
  }
}

// What the elastic loop learns from one attempt's output.
struct AttemptWatch {
  double start = 0;
  comm::FailureCause cause;
  double cause_at = -1;            // when the output first told of the failure
  double last_checkpoint_at = -1;  // when a "[checkpoint] step N saved" line was last seen
  int64_t last_checkpoint_step = -1;
  double first_step_at = -1;  // when the first "step N/M" line was seen
  // The failure before this attempt: when it happened and the seconds of steps it undid.
  int attempt = 1;
  double failed_at = -1, redo_s = 0;
  double lost_s = 0;  // set at this attempt's first step: the time the failure cost
};
AttemptWatch* g_watch = nullptr;

void say(const std::string& line) {
  std::fprintf(stderr, "[launch] %s\n", line.c_str());
  std::fflush(stderr);
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

double wall_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void watch_line(const comm::TaggedLine& t) {
  if (!g_watch) return;
  comm::note_failure_line(t.rank < 0 ? t.text : comm::format_rank_line(t), g_watch->cause);
  if (g_watch->cause_at < 0 && !g_watch->cause.what.empty()) g_watch->cause_at = wall_now();
  if (t.rank != 0) return;
  if (t.text.rfind("step ", 0) == 0 && t.text.find('/') != std::string::npos && g_watch->first_step_at < 0) {
    AttemptWatch& w = *g_watch;
    w.first_step_at = wall_now();
    if (w.failed_at >= 0) {  // said now, while the job runs, so that watchers see the recovery
      const double back = w.first_step_at - w.failed_at;
      w.lost_s = back + w.redo_s;
      say(str_cat("attempt ", w.attempt, " was training again ", seconds(back), " after the failure; time lost to it ",
                  seconds(w.lost_s), " (", seconds(w.redo_s), " from the last checkpoint to the failure's report, ",
                  seconds(back), " to restart)"));
    }
  }
  long long step = 0;
  if (std::sscanf(t.text.c_str(), "[checkpoint] step %lld saved", &step) == 1) {
    g_watch->last_checkpoint_at = wall_now();
    g_watch->last_checkpoint_step = step;
  }
}

// Rank 0's standard output passes unprefixed (generate and serve print only from rank 0, and
// their output must read as the one-process command's).
bool g_rank0_stdout_raw = false;

// Rewrites one complete line from mpirun or srun (stream: 1 stdout, 2 stderr) to our output.
void relay_line(const std::string& line, int stream, comm::Launcher launcher) {
  comm::TaggedLine t =
      launcher == comm::Launcher::srun ? comm::parse_srun_line(line, stream == 2) : comm::parse_tagged_line(line);
  watch_line(t);
  int fd = t.rank < 0 ? stream : (t.is_stderr ? 2 : 1);
  bool raw = t.rank == 0 && !t.is_stderr && (g_rank0_stdout_raw || t.text.rfind("SUMMARY ", 0) == 0);
  write_all(fd, (raw ? t.text : comm::format_rank_line(t)) + "\n");
}

// Runs mpirun or srun (launcher says which, and so how its output is tagged), relaying its output.
int run_relayed(const std::vector<std::string>& cmd, comm::Launcher launcher) {
  int out[2], err[2];
  LOOM_CHECK(pipe(out) == 0 && pipe(err) == 0, "launch", "pipe: ", std::strerror(errno));
  pid_t pid = fork();
  LOOM_CHECK(pid >= 0, "launch", "fork: ", std::strerror(errno));
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]), close(out[1]), close(err[0]), close(err[1]);
    std::vector<char*> argv;
    for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "[launch] cannot run %s: %s (%s)\n", argv[0], std::strerror(errno),
                 launcher == comm::Launcher::srun ? "is this a Slurm node? see --srun, or --launcher mpirun"
                                                  : "is Open MPI installed? see --mpirun");
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  g_child_pid = pid;
  // Ctrl-C reaches mpirun through the terminal; SIGTERM sent to us is passed on.
  struct sigaction ign {
  }, fwd{};
  ign.sa_handler = SIG_IGN;
  fwd.sa_handler = forward_signal;
  sigaction(SIGINT, &ign, nullptr);
  sigaction(SIGTERM, &fwd, nullptr);

  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string pending[2];
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (!pending[i].empty()) relay_line(pending[i], i + 1, launcher);
        pending[i].clear();
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      pending[i].append(buf, size_t(n));
      size_t start = 0, nl;
      while ((nl = pending[i].find('\n', start)) != std::string::npos) {
        relay_line(pending[i].substr(start, nl - start), i + 1, launcher);
        start = nl + 1;
      }
      pending[i].erase(0, start);
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child_pid = 0;
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// An argument as a POSIX shell reads it back, so a printed command can be pasted.
std::string shell_quoted(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-+=/.,:@%") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The test hosts that are up, from the state file `scripts/testhosts.sh up` writes; nullopt
// when there is none. A host the file lists must still have its namespace.
std::optional<comm::TestHosts> test_hosts_up() {
  const std::string path = comm::kTestHostsStatePath;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  comm::TestHosts t = comm::parse_test_hosts(text.str(), path);
  for (const auto& h : t.hosts)
    LOOM_CHECK(std::filesystem::exists("/run/netns/" + h), "launch", "test host ", h, " is listed in ", path,
               " but its network namespace is gone; run scripts/testhosts.sh up N again");
  return t;
}

struct ElasticOptions {
  int max_restarts = 0, min_nproc = 1, drop_after = 2;
  double delay_s = 1;
};

// Whether a host answers: a test host's namespace exists, any other runs `true` through the
// agent (ssh by default) within 10 s.
bool host_answers(const comm::LaunchOptions& o, const std::string& host) {
  if (o.test_hosts) return std::filesystem::exists("/run/netns/" + host);
  const std::string agent = o.agent.empty() ? "ssh -o BatchMode=yes -o ConnectTimeout=5" : o.agent;
  const std::string cmd = str_cat("timeout 10 ", agent, " ", shell_quoted(host), " true >/dev/null 2>&1");
  return std::system(cmd.c_str()) == 0;
}

// The restart loop of `loom launch --max-restarts`.
int run_elastic(comm::LaunchOptions o, const ElasticOptions& e) {
  const std::vector<std::string> original = o.args;
  const int original_nproc = o.nproc;
  const std::vector<comm::HostSlots> all_hosts = comm::parse_host_slots(o.hosts);
  std::vector<comm::HostSlots> active = all_hosts;
  std::vector<comm::HostSlots> dropped;
  std::vector<int> dropped_at;  // the restart that dropped each: it is probed from the next one on
  const double job_start = wall_now();
  double lost_total = 0, failed_at = -1, redo_s = 0;
  int restarts = 0, streak = 0, last_failed = -1;
  std::string last_failed_host;
  for (int attempt = 1;; ++attempt) {
    AttemptWatch w;
    w.start = wall_now();
    w.attempt = attempt;
    w.failed_at = failed_at;
    w.redo_s = redo_s;
    g_watch = &w;
    const int rc = run_relayed(comm::launch_command(o), o.launcher);
    g_watch = nullptr;
    const double ended = wall_now();
    // The failure's moment: its first trace in the output (mpirun's teardown after it is lost
    // time too, counted in the restart's share).
    const double now = w.cause_at >= 0 ? w.cause_at : ended;
    if (failed_at >= 0) {  // what the previous failure cost (all of this attempt, if it never trained)
      lost_total += w.first_step_at >= 0 ? w.lost_s : ended - failed_at + redo_s;
      failed_at = -1;
    }
    if (rc == 0) {
      say(str_cat("job finished after ", attempt, " attempt", attempt > 1 ? "s" : "", " (", restarts, " restart",
                  restarts == 1 ? "" : "s", ") in ", seconds(ended - job_start), "; ", seconds(lost_total),
                  " lost to failures"));
      return 0;
    }
    std::string cause = w.cause.what.empty() ? str_cat(o.launcher == comm::Launcher::srun ? "srun" : "mpirun",
                                                       " exited with status ", rc)
                                             : w.cause.what;
    if (w.cause.rank >= 0) cause = str_cat("rank ", w.cause.rank, " ", cause);
    // The work since the last checkpoint is redone after a restart.
    redo_s = now - (w.last_checkpoint_at >= 0 ? w.last_checkpoint_at : (w.first_step_at >= 0 ? w.first_step_at : now));
    if (w.cause.diverged || rc == kExitDiverged) {
      say(str_cat("attempt ", attempt, " diverged: ", cause,
                  "; not restarting (a restart from its last checkpoint would diverge again: change the settings, "
                  "then resume)"));
      return kExitDiverged;
    }
    if (w.cause.permanent) {
      say(str_cat("attempt ", attempt, " failed: ", cause, "; not restarting (it would fail the same way)"));
      return rc;
    }
    if (restarts >= e.max_restarts) {
      say(str_cat("attempt ", attempt, " failed after ", seconds(now - w.start), ": ", cause,
                  "; no restarts left (--max-restarts ", e.max_restarts, ")"));
      return rc;
    }
    ++restarts;
    failed_at = now;
    say(str_cat("attempt ", attempt, " failed after ", seconds(now - w.start), ": ", cause, "; ",
                w.last_checkpoint_step >= 0 ? str_cat("its last checkpoint (step ", w.last_checkpoint_step,
                                                      ") was reported ", seconds(redo_s), " before it")
                                            : std::string("it saved no checkpoint"),
                "; restart ", restarts, " of ", e.max_restarts, " with --resume auto"));
    // The same rank slot (or host) failing again and again: go on without it.
    const std::string host = active.empty() ? "" : comm::host_of_rank(active, w.cause.rank);
    const bool same = w.cause.rank >= 0 && (active.empty() ? w.cause.rank == last_failed : host == last_failed_host);
    streak = same ? streak + 1 : (w.cause.rank >= 0 ? 1 : 0);
    last_failed = w.cause.rank;
    last_failed_host = host;
    if (streak >= e.drop_after && o.nproc > e.min_nproc) {
      if (!active.empty() && active.size() > 1) {
        auto it = std::find_if(active.begin(), active.end(), [&](const comm::HostSlots& h) { return h.host == host; });
        if (it != active.end() && o.nproc - it->slots >= e.min_nproc) {
          say(str_cat("host ", host, " failed ", streak, " times in a row: going on without it, on ",
                      o.nproc - it->slots, " ranks (train: parallel.dp=auto keeps the global batch)"));
          dropped.push_back(*it);
          dropped_at.push_back(restarts);
          active.erase(it);
        }
      } else if (active.empty()) {
        const int n = comm::shrink_nproc(o.nproc, e.min_nproc);
        if (n > 0) {
          say(str_cat("rank ", w.cause.rank, " failed ", streak, " times in a row: going on with ", n,
                      " ranks instead of ", o.nproc, " (train: parallel.dp=auto keeps the global batch)"));
          o.nproc = n;
        }
      }
      streak = 0;
    }
    for (size_t i = 0; i < dropped.size();) {  // grow: hosts dropped at an earlier restart that answer
      if (dropped_at[i] < restarts && host_answers(o, dropped[i].host)) {
        say(str_cat("host ", dropped[i].host, " answers again: taking it back"));
        active.push_back(dropped[i]);
        dropped.erase(dropped.begin() + std::ptrdiff_t(i));
        dropped_at.erase(dropped_at.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
    if (!all_hosts.empty()) {  // keep the original host order; the slots add up to nproc
      std::vector<comm::HostSlots> ordered;
      for (const auto& h : all_hosts)
        if (std::any_of(active.begin(), active.end(), [&](const comm::HostSlots& a) { return a.host == h.host; }))
          ordered.push_back(h);
      active = ordered;
      o.hosts = comm::format_host_slots(active);
      o.nproc = 0;
      for (const auto& h : active) o.nproc += h.slots;
    }
    o.args = comm::restart_args(original, o.nproc != original_nproc);
    if (e.delay_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(e.delay_s));
  }
}

}  // namespace

std::string launch_exe() {
  if (const char* e = std::getenv("LOOM_LAUNCH_EXE"); e && *e) return e;
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  LOOM_CHECK(n > 0, "launch", "cannot resolve /proc/self/exe: ", std::strerror(errno));
  return std::string(buf, size_t(n));
}

int cmd_launch(const std::vector<std::string>& args) {
  auto app = new_app("launch",
                     "Runs N ranks of this loom binary under mpirun (inside a Slurm allocation: srun --mpi=pmix): "
                     "loom launch --nproc N -- <loom subcommand and its args>. Each output line is prefixed with its "
                     "rank (\"[rank 1] ...\"); rank 0's SUMMARY "
                     "line is passed through unprefixed, and so is all of rank 0's standard output for generate "
                     "and serve (--tp N: the other ranks print none). Forwards LOOM_*, OMP_*, PATH and "
                     "LD_LIBRARY_PATH; LOOM_LAUNCH_EXE runs another binary. Elastic restarts: "
                     "docs/FAULT_TOLERANCE.md.");
  comm::LaunchOptions o;
  int64_t nproc = 0, max_restarts = 0, min_nproc = 0, drop_after = 2;
  double timeout = -1, restart_delay = 1.0;
  const char* mpirun_env = std::getenv("LOOM_MPIRUN");
  o.mpirun = mpirun_env && *mpirun_env ? mpirun_env : "mpirun";
  bool dry_run = false;
  std::vector<std::string> inner;
  auto* nproc_opt = app->add_option("--nproc", nproc, "ranks to run (default: the --hosts slots)")
                        ->type_name("N")
                        ->check(positive())
                        ->default_str("");
  auto* hosts_opt = app->add_option("--hosts", o.hosts,
                                    "hosts and ranks per host (host:ranks,...); they must add up to --nproc, which may "
                                    "then be left out. Test hosts (loomh1..., made by scripts/testhosts.sh up N) get "
                                    "their agent and network automatically")
                        ->type_name("h1:4,h2:4");
  app->add_option("--hostfile", o.hostfile, "an mpirun hostfile")->type_name("FILE");
  app->add_option("--agent", o.agent, "how mpirun reaches the hosts instead of ssh (mca plm_rsh_agent)")
      ->type_name("CMD");
  app->add_option("--net", o.net,
                  "the network ranks and daemons talk over, e.g. 10.0.0.0/16 (mca btl_tcp_if_include and "
                  "oob_tcp_if_include)")
      ->type_name("CIDR");
  app->add_option("--timeout", timeout,
                  "comm watchdog timeout of the ranks in seconds: sets LOOM_COMM_TIMEOUT, which beats a config's "
                  "parallel.collective_timeout_s (--set beats both)")
      ->type_name("S")
      ->default_str("");
  app->add_option("--mpirun", o.mpirun, "the MPI launcher (default: $LOOM_MPIRUN or mpirun)")->type_name("PATH");
  std::string launcher = "auto";
  app->add_option("--launcher", launcher,
                  "what starts the ranks: srun in a Slurm allocation's batch script or salloc shell "
                  "(SLURM_JOB_ID set, SLURM_STEP_ID not, no --hosts or --hostfile), else mpirun")
      ->check(one_of({"auto", "mpirun", "srun"}));
  app->add_option("--srun", o.srun, "the srun to run inside an allocation (default: $LOOM_SRUN or srun)")
      ->type_name("PATH");
  const char* srun_env = std::getenv("LOOM_SRUN");
  if (srun_env && *srun_env) o.srun = srun_env;
  app->add_flag("--dry-run", dry_run, "print the mpirun (or srun) command instead of running it");
  app->add_option("--max-restarts", max_restarts, "restart a failed attempt up to K times, `train` with --resume auto")
      ->type_name("K")
      ->check(non_negative());
  auto* min_nproc_opt =
      app->add_option("--min-nproc", min_nproc,
                      "when the same rank (or host) fails --drop-after times in a row, go on with fewer ranks, down "
                      "to M (train gets parallel.dp=auto: the global batch stays, micro-batches grow); default: "
                      "--nproc (never)")
          ->type_name("M")
          ->check(positive())
          ->default_str("");
  app->add_option("--drop-after", drop_after, "failures in a row that drop a rank slot or host")
      ->type_name("F")
      ->check(positive());
  app->add_option("--restart-delay", restart_delay, "seconds between a failure and the restart")
      ->type_name("S")
      ->check(non_negative());
  app->add_option("COMMAND", inner, "the loom subcommand and its arguments, after --")->type_name("ARGS");
  if (auto rc = parse(*app, args)) return *rc;
  auto sep = std::find(args.begin(), args.end(), "--");
  const size_t after_sep = sep == args.end() ? 0 : size_t(args.end() - sep - 1);
  if (inner.size() > after_sep) throw UsageError("[launch] unexpected argument '" + inner[0] + "' before --");
  if (inner.empty())
    throw UsageError(
        "[launch] give the loom subcommand to run after --, e.g. "
        "loom launch --nproc 2 -- bench comm");
  const char* job_id = std::getenv("SLURM_JOB_ID");
  const char* step_id = std::getenv("SLURM_STEP_ID");
  const bool in_allocation = job_id && *job_id;
  // The batch script or an salloc shell: there, srun starts the ranks. Inside a job step (a
  // command srun started, e.g. `srun make test`) mpirun stays the default: a step in a step
  // is not what such a command means.
  const bool allocation_shell = in_allocation && !(step_id && *step_id);
  if (launcher == "srun" || (launcher == "auto" && allocation_shell && o.hosts.empty() && o.hostfile.empty()))
    o.launcher = comm::Launcher::srun;
  if (o.launcher == comm::Launcher::srun) {
    LOOM_CHECK(in_allocation, "launch",
               "--launcher srun needs a Slurm allocation, and SLURM_JOB_ID is not set; run loom launch inside an "
               "sbatch script or salloc, or leave --launcher out for mpirun");
    if (const char* n = std::getenv("SLURM_NTASKS"); n && *n) o.allocation_tasks = std::max(0, std::atoi(n));
  }
  if (!nproc_opt->count() && !hosts_opt->count() && o.allocation_tasks <= 0)
    throw UsageError(o.launcher == comm::Launcher::srun
                         ? "[launch] --nproc N is required: the allocation sets no SLURM_NTASKS (give sbatch "
                           "--ntasks or --ntasks-per-node, or loom launch --nproc)"
                         : "[launch] --nproc N is required (or --hosts h1:2,h2:2, whose ranks add up to N)");
  LOOM_CHECK(!comm::launch_env().under_mpi, "launch",
             "already running under an MPI launcher; run the subcommand directly");

  o.nproc = nproc_opt->count() ? int(nproc) : hosts_opt->count() ? comm::slots_in_hosts(o.hosts) : o.allocation_tasks;
  if (!o.hosts.empty()) comm::use_test_hosts(o, test_hosts_up());
  o.timeout_s = timeout;
  o.exe = launch_exe();
  o.args = inner;
  g_rank0_stdout_raw = o.args[0] == "generate" || o.args[0] == "serve";
  o.local_cores = int(std::max(1u, std::thread::hardware_concurrency()));
  o.as_root = geteuid() == 0;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    o.env_names.push_back(kv.substr(0, kv.find('=')));
  }
  std::vector<std::string> cmd = comm::launch_command(o);
  if (dry_run) {
    for (size_t i = 0; i < cmd.size(); ++i) std::printf("%s%s", i ? " " : "", shell_quoted(cmd[i]).c_str());
    std::printf("\n");
    return 0;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ElasticOptions e;
  e.max_restarts = int(max_restarts);
  e.min_nproc = min_nproc_opt->count() ? int(min_nproc) : o.nproc;
  e.drop_after = int(drop_after);
  e.delay_s = restart_delay;
  if (e.max_restarts < 0 || e.min_nproc < 1 || e.min_nproc > o.nproc || e.drop_after < 1 || e.delay_s < 0)
    throw UsageError(str_cat("[launch] --max-restarts must be >= 0, --min-nproc within 1..", o.nproc,
                             " (--nproc), --drop-after >= 1 and --restart-delay >= 0"));
  if (e.max_restarts == 0) return run_relayed(cmd, o.launcher);
  return run_elastic(o, e);
}

}  // namespace loom::cli
