// Runs `loom serve` as a child process for tests that need the real binary: reads its port
// from the "listening on" line, waits for /health, measures its resident memory, stops it
// with a signal and reports how it exited. The destructor kills a child still running.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/serve/client/http_client.h"

namespace loom::serve::testing {

class ServerProcess {
 public:
  // args: what follows `loom serve`; "--port 0" is added.
  explicit ServerProcess(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {std::string(LOOM_BINARY_DIR) + "/bin/loom", "serve", "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    int fds[2];
    LOOM_CHECK(::pipe(fds) == 0, "test", "pipe failed");
    pid_ = ::fork();
    LOOM_CHECK(pid_ >= 0, "test", "fork failed");
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_fd_ = fds[0];
    reader_ = std::thread([this] {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(out_fd_, buf, sizeof buf)) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        output_.append(buf, size_t(n));
      }
    });
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    if (reader_.joinable()) reader_.join();
    ::close(out_fd_);
  }

  std::string output() const {
    std::lock_guard<std::mutex> lock(mu_);
    return output_;
  }

  // Waits for the port line and then for /health to answer 200. False on timeout or exit.
  bool wait_ready(double seconds = 30) {
    double end = now_seconds() + seconds;
    const std::string marker = "listening on http://127.0.0.1:";
    while (port_ == 0 && now_seconds() < end) {
      std::string out = output();
      if (size_t at = out.find(marker);
          at != std::string::npos && out.find(' ', at + marker.size()) != std::string::npos)
        port_ = std::stoi(out.substr(at + marker.size()));
      else if (has_exited())
        return false;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    while (now_seconds() < end && !has_exited()) {
      try {
        if (HttpClient("127.0.0.1", port_, 2).request("GET", "/health").status == 200) return true;
      } catch (const std::exception&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  int64_t resident_bytes() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/statm");
    int64_t pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * int64_t(sysconf(_SC_PAGESIZE));
  }

  // Sends `sig` and waits up to `seconds`; returns the exit code, or -signal if it was killed
  // by one, or -1000 on timeout (then the child is killed).
  int stop(int sig, double seconds = 20) {
    ::kill(pid_, sig);
    double end = now_seconds() + seconds;
    int st = 0;
    while (now_seconds() < end) {
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        drain_output();
        return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1000;
  }

 private:
  bool has_exited() {
    int st;
    if (!exited_ && ::waitpid(pid_, &st, WNOHANG) == pid_) {
      exited_ = true;
      drain_output();
    }
    return exited_;
  }

  // Once the child has exited its last lines may still sit in the pipe: the reader ends at
  // EOF (the child was the only writer), so output() then holds everything it printed.
  void drain_output() {
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  bool exited_ = false;
  std::thread reader_;
  mutable std::mutex mu_;
  std::string output_;
};

}  // namespace loom::serve::testing
