#include "bench/loom/peer_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"

namespace loom::cli {

std::string peer_venv_dir(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "build/peers/" + name;
  return (exe.parent_path().parent_path() / "peers" / name).string();
}

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void exec_or_exit(const std::vector<std::string>& argv, const char* tag, bool search_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  if (search_path)
    execvp(args[0], args.data());
  else
    execv(args[0], args.data());
  std::fprintf(stderr, "[%s] cannot run %s: %s\n", tag, args[0], std::strerror(errno));
  _exit(127);
}

PeerProcess::PeerProcess(const std::vector<std::string>& argv) {
  int in[2], out[2];
  LOOM_CHECK(pipe(in) == 0 && pipe(out) == 0, "peer", "pipe failed: ", std::strerror(errno));
  what_ = argv.empty() ? "?" : argv[0];
  for (size_t i = 1; i < argv.size() && i < 3; ++i) what_ += " " + argv[i];
  pid_ = fork();
  LOOM_CHECK(pid_ >= 0, "peer", "fork failed: ", std::strerror(errno));
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    for (int fd : {in[0], in[1], out[0], out[1]})  // only 0 and 1 stay (a pipe end may be one of them)
      if (fd > 1) close(fd);
    exec_or_exit(argv, "peer", /*search_path=*/true);
  }
  close(in[0]);
  close(out[1]);
  to_child_ = in[1];
  from_child_ = out[0];
}

PeerProcess::~PeerProcess() {
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
  if (pid_ > 0) {
    int status = 0;
    for (int i = 0; i < 50; ++i) {  // give it 5 s to exit after stdin closes
      if (waitpid(pid_, &status, WNOHANG) == pid_) return;
      usleep(100000);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
}

void PeerProcess::terminate(double grace_s) {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  for (double waited = 0; waited < grace_s; waited += 0.05) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    usleep(50000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string PeerProcess::how_it_ended() {
  int status = 0;
  pid_t got = 0;
  for (int i = 0; i < 50 && pid_ > 0 && (got = waitpid(pid_, &status, WNOHANG)) == 0; ++i) usleep(20000);
  if (got != pid_) return "closed its output";
  pid_ = -1;
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return std::string("was killed by SIG") + (name ? name : std::to_string(sig).c_str()) + " (" + strsignal(sig) + ")";
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

void PeerProcess::signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

void PeerProcess::send_line(const std::string& line) {
  std::string s = line + "\n";
  LOOM_CHECK(write(to_child_, s.data(), s.size()) == ssize_t(s.size()), "peer", "cannot write to ", what_,
             " (it exited?)");
}

std::string PeerProcess::read_line() {
  for (;;) {
    auto nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    char buf[4096];
    ssize_t n = read(from_child_, buf, sizeof buf);
    LOOM_CHECK(n > 0, "peer", what_, " ", how_it_ended(), " before answering (see its messages above)");
    buffer_.append(buf, size_t(n));
  }
}

std::string PeerProcess::read_until(const std::string& prefix) {
  for (;;) {
    std::string line = read_line();
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
}

}  // namespace loom::cli
