// Reading launcher variables and building the mpirun command line of `loom launch`.
#include "loom/comm/launch.h"

#include <cstdint>

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

}  // namespace

LaunchEnv launch_env(const EnvLookup& get) {
  LaunchEnv e;
  struct Source {
    const char *rank, *size, *local_rank, *local_size, *label;
    bool mpi;
  };
  static const Source sources[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_*", true},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_*", true},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK/WORLD_SIZE", false},
  };
  for (const Source& s : sources) {
    int rank = 0, size = 1;
    bool has_rank = read_int(get, s.rank, &rank), has_size = read_int(get, s.size, &size);
    if (!has_rank && !has_size) continue;
    LOOM_CHECK(has_rank && has_size, "launch", has_rank ? s.rank : s.size, " is set but ",
               has_rank ? s.size : s.rank, " is not; a launcher sets both");
    LOOM_CHECK(size >= 1 && rank < size, "launch", s.rank, "=", rank, " is not below ", s.size, "=",
               size);
    e.rank = rank;
    e.world_size = size;
    e.local_rank = rank;
    e.local_size = size;
    read_int(get, s.local_rank, &e.local_rank);
    read_int(get, s.local_size, &e.local_size);
    e.source = s.label;
    e.under_mpi = s.mpi;
    return e;
  }
  return e;
}

bool is_forwarded_env(const std::string& name) {
  return name.rfind("LOOM_", 0) == 0 || name.rfind("OMP_", 0) == 0 || name == "PATH" ||
         name == "LD_LIBRARY_PATH";
}

int slots_in_hosts(const std::string& hosts) {
  int total = 0;
  size_t start = 0;
  while (start <= hosts.size()) {
    size_t comma = hosts.find(',', start);
    std::string h = hosts.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!h.empty()) {
      size_t colon = h.rfind(':');
      int n = 1;
      if (colon != std::string::npos) {
        char* end = nullptr;
        long v = std::strtol(h.c_str() + colon + 1, &end, 10);
        LOOM_CHECK(end && *end == '\0' && v > 0, "launch", "--hosts entry '", h,
                   "' should be host or host:slots with slots > 0");
        n = int(v);
      }
      total += n;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return total;
}

std::vector<std::string> mpirun_command(const LaunchOptions& o) {
  LOOM_CHECK(o.nproc >= 1, "launch", "--nproc ", o.nproc, " must be at least 1");
  LOOM_CHECK(o.hosts.empty() || o.hostfile.empty(), "launch",
             "give either --hosts or --hostfile, not both");
  LOOM_CHECK(!o.exe.empty(), "launch", "no executable to launch");
  std::vector<std::string> cmd = {o.mpirun, "-np", std::to_string(o.nproc)};
  int slots = o.local_cores;
  if (!o.hosts.empty()) {
    cmd.insert(cmd.end(), {"--host", o.hosts});
    slots = slots_in_hosts(o.hosts);
  } else if (!o.hostfile.empty()) {
    cmd.insert(cmd.end(), {"--hostfile", o.hostfile});
    slots = o.nproc;  // the file declares its slots; leave mapping to mpirun
  }
  if (o.nproc > slots) cmd.push_back("--oversubscribe");
  if (o.as_root) cmd.push_back("--allow-run-as-root");
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
  t.text = line.substr(close + 1 + kOut.size());
  return t;
}

std::string format_rank_line(const TaggedLine& line) {
  if (line.rank < 0) return line.text;
  return str_cat("[rank ", line.rank, "] ", line.text);
}

}  // namespace loom::comm
