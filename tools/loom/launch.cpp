// `loom launch --nproc N [--hosts h:4,.. | --hostfile F] [--timeout S] -- <subcommand ...>`:
// starts N copies of this loom binary under mpirun and relays their output line by line,
// each prefixed with its rank. Exits with mpirun's status (non-zero when any rank failed;
// mpirun then tears the other ranks down). Test hosts (scripts/testhosts.sh) are recognised
// from the state file their `up` writes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "tools/loom/commands.h"

extern char** environ;

namespace loom::cli {

namespace {

const char* kLaunchHelp =
    "usage: loom launch --nproc N [--hosts h1:4,h2:4 | --hostfile F] [--agent CMD] [--net CIDR]\n"
    "                   [--timeout S] [--mpirun PATH] [--dry-run] -- <loom subcommand and its args>\n\n"
    "Runs N ranks of this loom binary under mpirun. Each output line is prefixed with its\n"
    "rank (\"[rank 1] ...\"); rank 0's SUMMARY line is passed through unprefixed.\n"
    "  --hosts L     hosts and ranks per host (host:ranks,...); they must add up to --nproc,\n"
    "                which may then be left out. Test hosts (loomh1..., made by\n"
    "                scripts/testhosts.sh up N) get their agent and network automatically\n"
    "  --agent CMD   how mpirun reaches the hosts instead of ssh (mca plm_rsh_agent)\n"
    "  --net CIDR    the network ranks and daemons talk over, e.g. 10.0.0.0/16\n"
    "                (mca btl_tcp_if_include and oob_tcp_if_include)\n"
    "  --timeout S   comm watchdog timeout of the ranks in seconds: sets LOOM_COMM_TIMEOUT,\n"
    "                which beats a config's parallel.collective_timeout_s (--set beats both)\n"
    "  --dry-run     print the mpirun command instead of running it\n"
    "Forwards LOOM_*, OMP_*, PATH and LD_LIBRARY_PATH; LOOM_LAUNCH_EXE runs another binary.\n";

// The child's pid, for forwarding SIGTERM; a signal handler can reach nothing else.
volatile sig_atomic_t g_child_pid = 0;

void forward_signal(int sig) {
  if (g_child_pid > 0) kill(pid_t(g_child_pid), sig);
}

std::string self_exe() {
  if (const char* e = std::getenv("LOOM_LAUNCH_EXE"); e && *e) return e;
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  LOOM_CHECK(n > 0, "launch", "cannot resolve /proc/self/exe: ", std::strerror(errno));
  return std::string(buf, size_t(n));
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

// Rewrites one complete line from mpirun (stream: 1 stdout, 2 stderr) to our output.
void relay_line(const std::string& line, int stream) {
  comm::TaggedLine t = comm::parse_tagged_line(line);
  int fd = t.rank < 0 ? stream : (t.is_stderr ? 2 : 1);
  bool summary = t.rank == 0 && !t.is_stderr && t.text.rfind("SUMMARY ", 0) == 0;
  write_all(fd, (summary ? t.text : comm::format_rank_line(t)) + "\n");
}

int run_relayed(const std::vector<std::string>& cmd) {
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
    std::fprintf(stderr, "[launch] cannot run %s: %s (is Open MPI installed? see --mpirun)\n",
                 argv[0], std::strerror(errno));
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  g_child_pid = pid;
  // Ctrl-C reaches mpirun through the terminal; SIGTERM sent to us is passed on.
  struct sigaction ign {}, fwd {};
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
        if (!pending[i].empty()) relay_line(pending[i], i + 1);
        pending[i].clear();
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      pending[i].append(buf, size_t(n));
      size_t start = 0, nl;
      while ((nl = pending[i].find('\n', start)) != std::string::npos) {
        relay_line(pending[i].substr(start, nl - start), i + 1);
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
    LOOM_CHECK(std::filesystem::exists("/run/netns/" + h), "launch", "test host ", h, " is listed in ",
               path, " but its network namespace is gone; run scripts/testhosts.sh up N again");
  return t;
}

}  // namespace

int cmd_launch(const std::vector<std::string>& args) {
  auto sep = std::find(args.begin(), args.end(), "--");
  std::vector<std::string> own(args.begin(), sep);
  Args a("launch", own,
         {{"nproc", true}, {"hosts", true}, {"hostfile", true}, {"agent", true}, {"net", true},
          {"timeout", true}, {"mpirun", true}, {"dry-run", false}, {"help", false}});
  if (a.has("help")) {
    std::printf("%s", kLaunchHelp);
    return 0;
  }
  if (sep == args.end() || sep + 1 == args.end())
    throw UsageError("[launch] give the loom subcommand to run after --, e.g. "
                     "loom launch --nproc 2 -- bench comm");
  if (!a.has("nproc") && !a.has("hosts"))
    throw UsageError("[launch] --nproc N is required (or --hosts h1:2,h2:2, whose ranks add up to N)");
  if (!a.positional().empty())
    throw UsageError("[launch] unexpected argument '" + a.positional()[0] + "' before --");
  LOOM_CHECK(!comm::launch_env().under_mpi, "launch",
             "already running under an MPI launcher; run the subcommand directly");

  comm::LaunchOptions o;
  o.hosts = a.get("hosts", "");
  o.nproc = a.has("nproc") ? int(a.get_int("nproc", 1)) : comm::slots_in_hosts(o.hosts);
  o.hostfile = a.get("hostfile", "");
  o.agent = a.get("agent", "");
  o.net = a.get("net", "");
  if (!o.hosts.empty()) comm::use_test_hosts(o, test_hosts_up());
  o.timeout_s = a.get_double("timeout", -1);
  const char* mpirun_env = std::getenv("LOOM_MPIRUN");
  o.mpirun = a.get("mpirun", mpirun_env && *mpirun_env ? mpirun_env : "mpirun");
  o.exe = self_exe();
  o.args.assign(sep + 1, args.end());
  o.local_cores = int(std::max(1u, std::thread::hardware_concurrency()));
  o.as_root = geteuid() == 0;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    o.env_names.push_back(kv.substr(0, kv.find('=')));
  }
  std::vector<std::string> cmd = comm::mpirun_command(o);
  if (a.has("dry-run")) {
    for (size_t i = 0; i < cmd.size(); ++i)
      std::printf("%s%s", i ? " " : "", shell_quoted(cmd[i]).c_str());
    std::printf("\n");
    return 0;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return run_relayed(cmd);
}

}  // namespace loom::cli
