// Reading launcher variables and building the mpirun or srun command line of `loom launch`.
#include "loom/comm/launch.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>

#include "loom/core/error.h"

namespace loom::comm {

namespace {

bool read_int(const EnvLookup& get, const char* name, int* out) {
  const char* v = get(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  LOOM_CHECK(end && *end == '\0' && x >= 0 && x <= INT32_MAX, "launch", name, "=\"", v,
             "\" is not a non-negative integer");
  *out = int(x);
  return true;
}

struct HostSlots {
  std::string name;
  int slots = 1;
};

// "h1:4,h2" -> {{h1, 4}, {h2, 1}}; empty entries (",,") are skipped.
std::vector<HostSlots> parse_hosts(const std::string& hosts) {
  std::vector<HostSlots> out;
  size_t start = 0;
  while (start <= hosts.size()) {
    size_t comma = hosts.find(',', start);
    std::string h = hosts.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!h.empty()) {
      HostSlots hs{h, 1};
      size_t colon = h.rfind(':');
      if (colon != std::string::npos) {
        char* end = nullptr;
        long v = std::strtol(h.c_str() + colon + 1, &end, 10);
        LOOM_CHECK(colon > 0 && end && *end == '\0' && v > 0 && v <= 1 << 20, "launch", "--hosts entry '", h,
                   "' should be host or host:slots with slots > 0");
        hs = {h.substr(0, colon), int(v)};
      }
      out.push_back(std::move(hs));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

bool looks_like_test_host(const std::string& name) {
  const std::string prefix = kTestHostPrefix;
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
         name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

}  // namespace

LaunchEnv launch_env(const EnvLookup& get) {
  LaunchEnv e;
  struct Source {
    const char *rank, *size, *local_rank, *local_size, *label;
    bool mpi;
  };
  // srun's tasks come after Open MPI's ranks: mpirun inside an allocation starts its daemons
  // as a job step, so its ranks carry that step's SLURM_* too. They come before PMI_*, which
  // srun --mpi=pmi2 sets as well.
  static const Source sources[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
       "OMPI_COMM_WORLD_*", true},
      {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", nullptr, kSlurmSource, false},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_*", true},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK/WORLD_SIZE", false},
  };
  for (const Source& s : sources) {
    int rank = 0, size = 1;
    bool has_rank = read_int(get, s.rank, &rank), has_size = read_int(get, s.size, &size);
    if (!has_rank && !has_size) continue;
    const bool slurm = s.label == kSlurmSource;
    // The batch script of an sbatch job has SLURM_PROCID=0 but no step: it is no rank.
    if (slurm && !has_size) continue;
    LOOM_CHECK(has_rank && has_size, "launch", has_rank ? s.rank : s.size, " is set but ", has_rank ? s.size : s.rank,
               " is not; a launcher sets both");
    LOOM_CHECK(size >= 1 && rank < size, "launch", s.rank, "=", rank, " is not below ", s.size, "=", size);
    e.rank = rank;
    e.world_size = size;
    e.local_rank = rank;
    e.local_size = size;
    read_int(get, s.local_rank, &e.local_rank);
    if (s.local_size) read_int(get, s.local_size, &e.local_size);
    e.source = s.label;
    e.under_mpi = s.mpi;
    if (slurm) {
      const char* per_node = get("SLURM_STEP_TASKS_PER_NODE");
      int node = 0;
      if (per_node && *per_node && read_int(get, "SLURM_NODEID", &node))
        e.local_size = slurm_tasks_on_node(per_node, node);
      const char* mpi = get("SLURM_MPI_TYPE");
      e.slurm_mpi = mpi && std::strcmp(mpi, "none") != 0 ? mpi : "";
      const char* pmix = get("PMIX_RANK");
      e.under_mpi = pmix && *pmix;
    }
    return e;
  }
  return e;
}

int slurm_tasks_on_node(const std::string& list, int node) {
  // "2(x3),1": a count, optionally repeated for (xN) nodes, per comma-separated entry. The
  // whole list is checked before the node is looked up.
  int nodes = 0, found = -1;
  size_t start = 0;
  for (bool last = false; !last;) {
    const size_t comma = list.find(',', start);
    last = comma == std::string::npos;
    const std::string item = list.substr(start, last ? std::string::npos : comma - start);
    start = comma + 1;
    char* end = nullptr;
    const long tasks = std::strtol(item.c_str(), &end, 10);
    long repeat = 1;
    bool ok = !item.empty() && std::isdigit(static_cast<unsigned char>(item[0])) && tasks >= 0;
    if (ok && *end == '(') {
      char* rep_end = nullptr;
      ok = end[1] == 'x' && std::isdigit(static_cast<unsigned char>(end[2]));
      repeat = ok ? std::strtol(end + 2, &rep_end, 10) : 0;
      ok = ok && repeat >= 1 && repeat <= 1 << 20 && rep_end[0] == ')' && rep_end[1] == '\0';
    } else {
      ok = ok && *end == '\0';
    }
    LOOM_CHECK(ok, "launch", "SLURM_STEP_TASKS_PER_NODE=\"", list, "\": entry '", item,
               "' is not N or N(xM); is this Slurm's own value?");
    if (found < 0 && node >= nodes && node < nodes + repeat) found = int(tasks);
    nodes += int(repeat);
  }
  LOOM_CHECK(found >= 0, "launch", "SLURM_STEP_TASKS_PER_NODE=\"", list, "\" names ", nodes,
             " nodes but SLURM_NODEID is ", node);
  return found;
}

std::string srun_mpi_problem(const LaunchEnv& env) {
  if (!env.under_srun() || env.under_mpi || env.world_size == 1) return "";
  const std::string how = env.slurm_mpi.empty()
                              ? std::string("without an MPI plugin (srun --mpi=none, or the cluster's MpiDefault)")
                              : str_cat("with --mpi=", env.slurm_mpi, " (SLURM_MPI_TYPE)");
  return str_cat("srun started this as task ", env.rank, " of ", env.world_size, " ", how,
                 ", which gives Open MPI no peers: it finds them through PMIx only. Run srun --mpi=pmix "
                 "(srun --mpi=list shows the plugins; a site can make it the default with MpiDefault=pmix), or start "
                 "the ranks with `loom launch` inside the allocation, which does");
}

bool is_forwarded_env(const std::string& name) {
  return name.rfind("LOOM_", 0) == 0 || name.rfind("OMP_", 0) == 0 || name == "PATH" || name == "LD_LIBRARY_PATH";
}

int slots_in_hosts(const std::string& hosts) {
  int total = 0;
  for (const HostSlots& h : parse_hosts(hosts)) total += h.slots;
  return total;
}

std::vector<std::string> host_names(const std::string& hosts) {
  std::vector<std::string> names;
  for (HostSlots& h : parse_hosts(hosts)) names.push_back(std::move(h.name));
  return names;
}

std::vector<std::string> mpirun_command(const LaunchOptions& o) {
  LOOM_CHECK(o.nproc >= 1, "launch", "--nproc ", o.nproc, " must be at least 1");
  LOOM_CHECK(o.hosts.empty() || o.hostfile.empty(), "launch", "give either --hosts or --hostfile, not both");
  LOOM_CHECK(!o.exe.empty(), "launch", "no executable to launch");
  std::vector<std::string> cmd = {o.mpirun, "-np", std::to_string(o.nproc)};
  int slots = o.local_cores;
  if (!o.hosts.empty()) {
    // mpirun would silently pack fewer ranks onto the first hosts, or stack extra ones on
    // top: either way not the layout the list describes.
    slots = slots_in_hosts(o.hosts);
    LOOM_CHECK(slots == o.nproc, "launch", "--hosts ", o.hosts, " has ", slots, " slots but --nproc is ", o.nproc,
               "; give each host the number of ranks it should ",
               "run (host:ranks) so that they add up to --nproc, or leave --nproc out");
    cmd.insert(cmd.end(), {"--host", o.hosts});
  } else if (!o.hostfile.empty()) {
    cmd.insert(cmd.end(), {"--hostfile", o.hostfile});
    slots = o.nproc;  // the file declares its slots; leave mapping to mpirun
  }
  if (o.nproc > slots) cmd.push_back("--oversubscribe");
  if (o.as_root) cmd.push_back("--allow-run-as-root");
  if (!o.agent.empty()) cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", o.agent});
  if (o.test_hosts) {
    // ob1 with shared memory inside a host and TCP between hosts, whatever faster
    // transports (UCX, OFI) the machine offers: the two-level topology under test.
    cmd.insert(cmd.end(), {"--mca", "pml", "ob1", "--mca", "btl", "vader,tcp,self"});
  }
  if (!o.net.empty()) {
    // The daemons' out-of-band channel and the ranks' TCP transport both stay on this
    // network (mpirun would otherwise offer addresses the hosts cannot reach).
    cmd.insert(cmd.end(), {"--mca", "btl_tcp_if_include", o.net, "--mca", "oob_tcp_if_include", o.net});
  }
  // Ranks run OpenMP kernels and a comm worker thread each; pinning a rank to one core
  // would serialise them, so leave placement to the OS.
  cmd.insert(cmd.end(), {"--bind-to", "none", "--tag-output"});
  for (const auto& n : o.env_names)
    if (is_forwarded_env(n) && n != "LOOM_COMM_TIMEOUT") cmd.insert(cmd.end(), {"-x", n});
  if (o.timeout_s > 0) {
    cmd.insert(cmd.end(), {"-x", str_cat("LOOM_COMM_TIMEOUT=", o.timeout_s)});
  } else {
    for (const auto& n : o.env_names)
      if (n == "LOOM_COMM_TIMEOUT") cmd.insert(cmd.end(), {"-x", n});
  }
  cmd.push_back(o.exe);
  cmd.insert(cmd.end(), o.args.begin(), o.args.end());
  return cmd;
}

std::vector<std::string> srun_command(const LaunchOptions& o) {
  LOOM_CHECK(o.nproc >= 1, "launch", "--nproc ", o.nproc, " must be at least 1");
  LOOM_CHECK(!o.exe.empty(), "launch", "no executable to launch");
  const char* only_mpirun = !o.hosts.empty()      ? "--hosts"
                            : !o.hostfile.empty() ? "--hostfile"
                            : !o.agent.empty()    ? "--agent"
                            : !o.net.empty()      ? "--net"
                                                  : nullptr;
  LOOM_CHECK(!only_mpirun, "launch", only_mpirun,
             " is for mpirun, but inside a Slurm allocation the ranks start with srun on the nodes Slurm gave; "
             "leave it out (choose nodes with sbatch --nodes/--nodelist), or add --launcher mpirun");
  LOOM_CHECK(o.allocation_tasks <= 0 || o.nproc <= o.allocation_tasks, "launch", "--nproc ", o.nproc,
             " is more than the allocation's ", o.allocation_tasks,
             " tasks (SLURM_NTASKS); ask sbatch for --ntasks=", o.nproc,
             " (or --nodes and --ntasks-per-node that multiply to it), or give --nproc ", o.allocation_tasks);
  std::vector<std::string> cmd = {
      o.srun, str_cat("--ntasks=", o.nproc), "--mpi=pmix", "--kill-on-bad-exit=1", "--distribution=block", "--label"};
  // srun passes this environment on whole; only the watchdog timeout is added.
  if (o.timeout_s > 0) cmd.push_back(str_cat("--export=ALL,LOOM_COMM_TIMEOUT=", o.timeout_s));
  cmd.push_back(o.exe);
  cmd.insert(cmd.end(), o.args.begin(), o.args.end());
  return cmd;
}

std::vector<std::string> launch_command(const LaunchOptions& o) {
  return o.launcher == Launcher::srun ? srun_command(o) : mpirun_command(o);
}

TestHosts parse_test_hosts(const std::string& text, const std::string& path) {
  TestHosts t;
  bool has_hosts = false;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    start = nl == std::string::npos ? text.size() : nl + 1;
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    LOOM_CHECK(eq != std::string::npos, "launch", path, ": line '", line,
               "' is not key=value; recreate it with scripts/testhosts.sh up N");
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "hosts") {
      has_hosts = true;
      size_t p = 0;
      while (p < value.size()) {
        size_t sp = value.find(' ', p);
        if (sp == std::string::npos) sp = value.size();
        if (sp > p) t.hosts.push_back(value.substr(p, sp - p));
        p = sp + 1;
      }
    } else if (key == "agent") {
      t.agent = value;
    } else if (key == "net") {
      t.net = value;
    }
  }
  const char* missing = !has_hosts ? "hosts" : t.agent.empty() ? "agent" : t.net.empty() ? "net" : nullptr;
  LOOM_CHECK(!missing, "launch", path, " has no '", missing, "=' line; recreate it with scripts/testhosts.sh up N");
  return t;
}

void use_test_hosts(LaunchOptions& o, const std::optional<TestHosts>& up) {
  if (o.hosts.empty()) return;
  std::vector<std::string> names = host_names(o.hosts), test, other;
  for (const auto& n : names) {
    bool is_test = up ? std::find(up->hosts.begin(), up->hosts.end(), n) != up->hosts.end() : looks_like_test_host(n);
    (is_test ? test : other).push_back(n);
  }
  if (test.empty()) return;  // real hosts: mpirun's ssh, or the agent given
  // `testhosts.sh up N` makes loomh1..loomhN: the N that covers every loomh<i> named.
  long hosts_needed = 0;
  for (const auto& n : names)
    if (looks_like_test_host(n))
      hosts_needed = std::max(hosts_needed, std::strtol(n.c_str() + std::strlen(kTestHostPrefix), nullptr, 10));
  LOOM_CHECK(up, "launch", "--hosts names ", joined(test, ", "),
             test.size() > 1 ? ", which look like test hosts" : ", which looks like a test host",
             ", but none are up (no ", kTestHostsStatePath, "); create them with scripts/testhosts.sh up ",
             hosts_needed, " (as root)");
  if (!other.empty()) {
    const bool test_like = looks_like_test_host(other[0]);
    fail("launch", "--hosts ", o.hosts, ": ", joined(other, ", "), other.size() > 1 ? " are" : " is", " not ",
         test_like ? "up" : "a test host", " (test hosts up: ", joined(up->hosts, " "), "); ",
         test_like ? str_cat("bring them up with scripts/testhosts.sh up ", hosts_needed)
                   : std::string("use only test hosts"),
         ", or list real hosts only");
  }
  o.test_hosts = true;
  if (o.agent.empty()) o.agent = up->agent;
  if (o.net.empty()) o.net = up->net;
}

TaggedLine parse_tagged_line(const std::string& line) {
  TaggedLine t;
  t.text = line;
  // "[<jobid>,<rank>]<stdout>:" or "<stderr>:"
  if (line.empty() || line[0] != '[') return t;
  size_t comma = line.find(',');
  size_t close = line.find(']');
  if (comma == std::string::npos || close == std::string::npos || comma > close) return t;
  static const std::string kOut = "<stdout>:", kErr = "<stderr>:";
  bool out = line.compare(close + 1, kOut.size(), kOut) == 0;
  bool err = line.compare(close + 1, kErr.size(), kErr) == 0;
  if (!out && !err) return t;
  std::string rank = line.substr(comma + 1, close - comma - 1);
  if (rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos) return t;
  t.rank = std::stoi(rank);
  t.is_stderr = err;
  // mpirun tags every write, so a line written in pieces (streamed tokens) carries the tag
  // again before each piece; those repeats are dropped.
  const std::string tag = line.substr(0, close + 1 + kOut.size());
  t.text.clear();
  for (size_t at = tag.size(), next; at <= line.size(); at = next + tag.size()) {
    next = line.find(tag, at);
    t.text.append(line, at, next == std::string::npos ? std::string::npos : next - at);
    if (next == std::string::npos) break;
  }
  return t;
}

TaggedLine parse_srun_line(const std::string& line, bool is_stderr) {
  TaggedLine t;
  t.text = line;
  const size_t digits = line.find_first_not_of(' ');
  if (digits == std::string::npos) return t;
  const size_t colon = line.find_first_not_of("0123456789", digits);
  if (colon == digits || colon == std::string::npos || line.compare(colon, 2, ": ") != 0) return t;
  t.rank = std::stoi(line.substr(digits, colon - digits));
  t.is_stderr = is_stderr;
  t.text = line.substr(colon + 2);
  return t;
}

std::string format_rank_line(const TaggedLine& line) {
  if (line.rank < 0) return line.text;
  return str_cat("[rank ", line.rank, "] ", line.text);
}

}  // namespace loom::comm
