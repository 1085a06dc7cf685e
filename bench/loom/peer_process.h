// A child process spoken to line by line over stdin/stdout: how benchmarks drive their
// peers (e.g. the PyTorch reference) in the same invocation, alternating with loom's runs.
#pragma once
#include <string>
#include <vector>

namespace loom::cli {

// BUILD/peers/NAME for the binary BUILD/bin/loom: a peer's private venv lives beside the build
// that uses it (build/peers/NAME when /proc/self/exe cannot be read).
std::string peer_venv_dir(const std::string& name);
// `s` quoted for a POSIX shell command line (std::system).
std::string shell_quoted(const std::string& s);

// In a forked child: becomes argv (argv[0] looked up in PATH when `search_path`), or says
// "[tag] cannot run ARGV0: why" on stderr and exits with 127, as a shell does.
[[noreturn]] void exec_or_exit(const std::vector<std::string>& argv, const char* tag, bool search_path);

class PeerProcess {
 public:
  explicit PeerProcess(const std::vector<std::string>& argv);
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  void send_line(const std::string& line);
  // Next line of the child's stdout; throws if it exits first (its stderr passes through).
  std::string read_line();
  // Reads lines until one starts with `prefix`; returns the rest of that line.
  std::string read_until(const std::string& prefix);
  // Asks the child to end (SIGTERM), waits up to `grace_s`, then kills it. Idempotent.
  void terminate(double grace_s = 10);
  // Sends a signal (e.g. SIGHUP) to the child.
  void signal(int sig);

 private:
  // After its stdout closed: "exited with status N", "was killed by SIGSEGV (...)", or
  // "closed its output" when it is still running after a second.
  std::string how_it_ended();
  int pid_ = -1, to_child_ = -1, from_child_ = -1;
  std::string buffer_;
  std::string what_;
};

}  // namespace loom::cli
