// The HTTP server's acceptor, its bounded set of connection threads (the longest-waiting one
// evicted when full) and its shutdown. Thread model: the acceptor owns the listening socket;
// each connection thread owns its socket (http_connection.h). stop() only calls shutdown(2) on
// sockets (under mu_, so never on a descriptor that was already closed and reused).
#include "loom/net/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/net/http_connection.h"

namespace loom::net {

namespace {
constexpr double kStopDrainS = 3.0;  // stop() shuts down whatever is still open after this
}  // namespace

struct HttpServer::Slot {
  int fd = -1;  // -1 once the connection thread closed it
  std::thread thread;
  std::atomic<bool> done{false};
  std::atomic<double> waiting_since{0};  // see Connection; -1: evicted
};

// ---------------------------------------------------------------- HttpServer

HttpServer::HttpServer(HttpServerOptions opt, Handler handler, ErrorRenderer render_error)
    : opt_(std::move(opt)), handler_(std::move(handler)), render_error_(std::move(render_error)) {}

HttpServer::~HttpServer() { stop(); }

HttpResponse HttpServer::render_error(int status, const std::string& message) const {
  if (render_error_) return render_error_(status, message);
  HttpResponse r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = message + "\n";
  return r;
}

void HttpServer::handle(HttpExchange& ex) { handler_(ex); }

void HttpServer::start() {
  LOOM_CHECK(listen_fd_ < 0, "serve", "server already started");
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  std::string port = std::to_string(opt_.port);
  int rc = ::getaddrinfo(opt_.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) fail("serve", "cannot resolve --host ", opt_.host, ": ", gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = res; a && listen_fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 512) == 0) {
      listen_fd_ = fd;
    } else {
      last_error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0)
    fail("serve", "cannot listen on ", opt_.host, ":", opt_.port, ": ", last_error, " (pick another --port or --host)");
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  LOOM_CHECK(wake_fd_ >= 0 && stop_fd_ >= 0, "serve", "eventfd failed: ", std::strerror(errno));
  accepting_ = true;
  acceptor_ = std::thread([this] { accept_loop(); });
}

void HttpServer::accept_loop() {
  while (accepting_) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int r = ::poll(p, 2, 200);
    reap(false);
    if (r <= 0 || (p[1].revents & POLLIN)) continue;
    if (!(p[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) ::poll(nullptr, 0, 50);  // let connections close
      continue;
    }
    serve_connection(fd);
  }
}

void HttpServer::serve_connection(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // SSE events go out at once
  timeval tv{};
  tv.tv_sec = time_t(opt_.write_timeout_s);
  tv.tv_usec = suseconds_t((opt_.write_timeout_s - double(tv.tv_sec)) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  auto refuse = [&](const std::string& why) {
    HttpResponse e = render_error(503, why);
    std::string msg = response_head(503, e.content_type, int64_t(e.body.size()), true, e.headers) + e.body;
    (void)!::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(fd);
  };
  // Full: the connection that has waited longest for a request head (a slow or idle client)
  // is closed to make room; only when every connection is busy with a request is the new
  // one refused.
  if (open_.load() >= opt_.max_connections && !evict_oldest_waiting())
    return refuse(str_cat("too many connections (limit ", opt_.max_connections, "), all busy"));
  auto slot = std::make_unique<Slot>();
  Slot* s = slot.get();
  s->fd = fd;
  s->waiting_since = now_seconds();
  ++open_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots_.push_back(std::move(slot));
  }
  try {
    s->thread = std::thread([this, s, fd] {
      Connection conn(*this, fd, s->waiting_since);
      try {
        conn.run();
        conn.linger();
      } catch (...) {
        // A failure inside one connection must never take the server down.
      }
      std::lock_guard<std::mutex> lock(mu_);
      ::close(fd);
      s->fd = -1;
      s->done = true;
      --open_;
    });
  } catch (const std::exception& e) {  // no thread (resource limits): refuse, keep serving
    std::fprintf(stderr, "[serve] cannot start a connection thread (%s); refused the connection with 503\n", e.what());
    {
      std::lock_guard<std::mutex> lock(mu_);
      s->fd = -1;
      s->done = true;
    }
    --open_;
    refuse("the server cannot take another connection now; retry");
  }
}

std::string HttpServer::next_error_id() {
  return str_cat(std::hex, (uint64_t(::getpid()) << 32) | uint64_t(++errors_));
}

bool HttpServer::evict_oldest_waiting() {
  std::lock_guard<std::mutex> lock(mu_);
  for (;;) {
    Slot* oldest = nullptr;
    double since = 0;
    for (auto& s : slots_) {
      const double w = s->waiting_since.load();
      if (s->fd < 0 || w <= 0) continue;
      if (!oldest || w < since) oldest = s.get(), since = w;
    }
    if (!oldest) return false;
    // Marked -1 only if it is still waiting (its head did not complete meanwhile): its
    // thread then sees end of input and ends with no request under way.
    if (!oldest->waiting_since.compare_exchange_strong(since, -1.0)) continue;
    ::shutdown(oldest->fd, SHUT_RDWR);
    ++evicted_;
    return true;
  }
}

void HttpServer::reap(bool all) {
  std::list<std::unique_ptr<Slot>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (all || (*it)->done) {
        finished.push_back(std::move(*it));
        it = slots_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : finished)
    if (s->thread.joinable()) s->thread.join();
}

void HttpServer::stop_accepting() {
  if (!accepting_.exchange(false)) return;
  draining_ = true;
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  if (acceptor_.joinable()) acceptor_.join();
  // Connections the kernel completed that nobody accepted yet would be reset by the close
  // below: they are accepted and served like the others (their requests meet a draining
  // server). Only a connection completing between the last accept and the close is refused.
  ::fcntl(listen_fd_, F_SETFL, ::fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0)
      serve_connection(fd);
    else if (errno != EINTR && errno != ECONNABORTED)
      break;
  }
  ::close(listen_fd_);
}

void HttpServer::stop() {
  if (stopped_.exchange(true)) return;
  if (listen_fd_ < 0) return;
  stop_accepting();
  uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof one);
  const double deadline = now_seconds() + kStopDrainS;
  while (open_.load() > 0 && now_seconds() < deadline) ::poll(nullptr, 0, 5);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : slots_)
      if (s->fd >= 0) ::shutdown(s->fd, SHUT_RDWR);
  }
  reap(true);
  ::close(wake_fd_);
  ::close(stop_fd_);
}

}  // namespace loom::net
