// `loom serve` shutting down under load: every connection the kernel accepted before SIGTERM,
// whether a thread was serving it or it still sat in the listen backlog, gets a complete
// answer (200, or a 503 naming the shutdown), never a reset or an empty reply, and the process
// exits 0 promptly.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>

#include "serve/server_fixture.h"
#include "serve/server_process.h"

namespace loom::serve::testing {
namespace {

// One request on its own connection, sent whole before the answer is read.
class RawRequest {
 public:
  RawRequest(int port, const std::string& bytes) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (connected_) sent_ = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size());
  }
  ~RawRequest() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool sent() const { return connected_ && sent_; }

  // "200", "503", or what went wrong ("reset", "empty reply", "truncated 503", ...).
  std::string outcome(double timeout_s) {
    std::string in;
    double end = now_seconds() + timeout_s;
    for (;;) {
      if (auto verdict = complete(in)) return *verdict;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, std::max(1, int((end - now_seconds()) * 1000))) <= 0) return "no answer in time";
      char buf[8192];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno == ECONNRESET ? "reset" : std::string("recv: ") + std::strerror(errno);
      if (n == 0) return in.empty() ? "empty reply" : "truncated: " + in;
      in.append(buf, size_t(n));
    }
  }

 private:
  // The verdict once `in` holds a whole response with a Content-Length body.
  static std::optional<std::string> complete(const std::string& in) {
    size_t head = in.find("\r\n\r\n");
    if (head == std::string::npos) return std::nullopt;
    std::string lower = net::to_lower(in.substr(0, head));
    size_t cl = lower.find("content-length:");
    if (cl == std::string::npos) return "no content-length: " + in.substr(0, head);
    if (in.size() < head + 4 + std::stoul(lower.substr(cl + 15))) return std::nullopt;
    std::string status = in.substr(9, 3), body = in.substr(head + 4);
    if (status == "200" && body.find("\"choices\"") != std::string::npos) return status;
    if (status == "503" && body.find("shutting down") != std::string::npos) return status;
    return "unexpected " + status + ": " + body;
  }

  int fd_ = -1;
  bool connected_ = false, sent_ = false;
};

std::string completion(int max_tokens) {
  json body = {{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", max_tokens}};
  return raw_post("/v1/completions", body.dump());
}

// Requests running and queued in the engine, and requests still in the listen backlog (the
// server is stopped with SIGSTOP while they connect, so none of them is accepted before the
// SIGTERM): the backlog used to be reset by closing the listening socket.
TEST(ServeShutdown, EveryAcceptedConnectionGetsACompleteAnswer) {
  ServerProcess proc({"--model", "gpt2-tiny", "--seed", "3", "--served-model-name", "tiny", "--max-num-seqs", "2",
                      "--n-ctx", "1024", "--kv-cache-mb", "4", "--threads", "1", "--shutdown-grace", "0.3"});
  ASSERT_TRUE(proc.wait_ready()) << proc.output();
  HttpClient streaming("127.0.0.1", proc.port(), 10);
  json body = {{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 1000}, {"stream", true}};
  ASSERT_EQ(streaming.start_stream("POST", "/v1/completions", body.dump()).status, 200);
  ASSERT_TRUE(streaming.next_event());  // generation is under way
  std::vector<std::unique_ptr<RawRequest>> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(std::make_unique<RawRequest>(proc.port(), completion(1000)));

  ASSERT_EQ(::kill(proc.pid(), SIGSTOP), 0);
  for (int i = 0; i < 64; ++i) requests.push_back(std::make_unique<RawRequest>(proc.port(), completion(8)));
  ASSERT_EQ(::kill(proc.pid(), SIGTERM), 0);
  ASSERT_EQ(::kill(proc.pid(), SIGCONT), 0);

  std::map<std::string, int> outcomes;
  for (auto& r : requests) {
    ASSERT_TRUE(r->sent());
    ++outcomes[r->outcome(20)];
    r->close();
  }
  std::string last;
  EXPECT_NO_THROW({
    while (auto ev = streaming.next_event()) last = *ev;
  });
  EXPECT_TRUE(last == "[DONE]" || last.find("shutting down") != std::string::npos) << last;
  std::string summary;
  for (const auto& [what, n] : outcomes) summary += str_cat(n, " x ", what, "\n");
  EXPECT_EQ(outcomes["200"] + outcomes["503"], int(requests.size())) << summary;
  const double t0 = now_seconds();
  EXPECT_EQ(proc.stop(0, 20), 0) << proc.output();
  EXPECT_LT(now_seconds() - t0, 10.0);
}

}  // namespace
}  // namespace loom::serve::testing
