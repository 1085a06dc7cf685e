// The emulated WAN link (see wan_relay.h).
// Thread model: one acceptor thread; per connection, one thread that connects to the target and
// then relays client -> target while a second thread relays target -> client. Each direction
// polls its source, its destination and the clock, so it also sees stop() within kPollSlice.
// Descriptors are closed only under conns_mu_, and stop() shuts them down under it, so it never
// touches a descriptor number that was already reused.
#include "bench/loom/wan_relay.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>
#include <system_error>

#include "loom/core/error.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollSlice = std::chrono::milliseconds(100);  // longest a thread waits unaware of stop()
constexpr auto kConnectTimeout = std::chrono::seconds(10);

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void check_link(const WanLinkOptions& link) {
  LOOM_CHECK(std::isfinite(link.delay_s) && link.delay_s >= 0, "wan-relay", "delay_s=", link.delay_s,
             " must be a one-way delay in seconds >= 0");
  LOOM_CHECK(std::isfinite(link.rate_bps) && link.rate_bps >= 0, "wan-relay", "rate_bps=", link.rate_bps,
             " must be bits per second >= 0 (0: unlimited)");
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// A poll of `fds` that returns by `deadline` (capped at kPollSlice from now).
int poll_until(pollfd* fds, nfds_t n, Clock::time_point deadline) {
  auto wait = std::clamp(deadline - Clock::now(), Clock::duration::zero(),
                         std::chrono::duration_cast<Clock::duration>(kPollSlice));
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  return ::ppoll(fds, n, &ts, nullptr);
}

// The addresses of host:port, or a loom::Error naming them.
WanRelay::Addresses resolve(const std::string& host, int port, bool passive, const char* what) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    fail("wan-relay", "cannot resolve the ", what, " ", host, ":", port, ": ", gai_strerror(rc), " (check the host)");
  WanRelay::Addresses out;
  for (addrinfo* a = res; a; a = a->ai_next) {
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    out.emplace_back(addr, a->ai_addrlen);
  }
  ::freeaddrinfo(res);
  return out;
}

struct Chunk {
  Clock::time_point release;  // when it may be written to the destination
  std::vector<char> bytes;
  bool eof = false;  // the source's EOF, to be delivered as shutdown(SHUT_WR)
  size_t sent = 0;
};

}  // namespace

struct WanRelay::Connection {
  int client_fd = -1, target_fd = -1;  // written and closed under conns_mu_
  Clock::time_point handshake_done;    // accept time + one round trip
  std::atomic<bool> failed{false};
  std::atomic<bool> finished{false};  // set last, under conns_mu_: the thread can be joined
  std::thread thread;

  // Ends both directions: wakes the other direction's thread, which then sees `failed`.
  void fail() {
    failed = true;
    ::shutdown(client_fd, SHUT_RDWR);
    ::shutdown(target_fd, SHUT_RDWR);
  }
};

WanRelay::WanRelay(std::string listen_host, int listen_port, std::string target_host, int target_port,
                   WanLinkOptions link)
    : listen_host_(std::move(listen_host)),
      target_host_(std::move(target_host)),
      listen_port_(listen_port),
      target_port_(target_port),
      link_(link) {
  check_link(link);
  LOOM_CHECK(listen_port >= 0 && listen_port <= 65535, "wan-relay", "listen port ", listen_port,
             " must be in 0..65535 (0: a free port)");
  LOOM_CHECK(target_port > 0 && target_port <= 65535, "wan-relay", "target port ", target_port, " must be in 1..65535");
}

WanRelay::~WanRelay() { stop(); }

void WanRelay::set_link(WanLinkOptions link) {
  check_link(link);
  std::lock_guard lock(link_mu_);
  link_ = link;
}

WanLinkOptions WanRelay::link() const {
  std::lock_guard lock(link_mu_);
  return link_;
}

int WanRelay::port() const { return port_; }

WanRelay::Stats WanRelay::stats() const {
  return Stats{connections_.load(), refused_.load(), bytes_up_.load(),
               bytes_down_.load(),  read_up_.load(), read_down_.load()};
}

void WanRelay::start() {
  std::lock_guard lifecycle(lifecycle_mu_);
  LOOM_CHECK(listen_fd_ < 0 && !acceptor_.joinable() && !stopping_, "wan-relay",
             "start() called twice or after stop(); make a new WanRelay instead");
  target_addrs_ = resolve(target_host_, target_port_, false, "target");
  std::string last_error = "no address";
  for (const auto& [addr, len] : resolve(listen_host_, listen_port_, true, "listen address")) {
    int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0 && ::listen(fd, 512) == 0) {
      listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  if (listen_fd_ < 0)
    fail("wan-relay", "cannot listen on ", listen_host_, ":", listen_port_, ": ", last_error,
         " (pick another port, or 0 for a free one)");
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

void WanRelay::stop() {
  std::lock_guard lifecycle(lifecycle_mu_);
  stopping_ = true;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);  // wakes the acceptor's poll now
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  {
    std::lock_guard lock(conns_mu_);
    for (auto& c : conns_) {
      if (c->client_fd >= 0) ::shutdown(c->client_fd, SHUT_RDWR);
      if (c->target_fd >= 0) ::shutdown(c->target_fd, SHUT_RDWR);
    }
  }
  // The acceptor is gone, so conns_ changes no more; each thread closes its own descriptors.
  for (auto& c : conns_) c->thread.join();
  conns_.clear();
}

void WanRelay::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(kPollSlice.count()));
    std::lock_guard lock(conns_mu_);
    reap_finished();
    if (r <= 0 || stopping_) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // EMFILE etc.: the poll above paces the retries
    if (conns_.size() >= static_cast<size_t>(kMaxConnections)) {
      ::close(fd);
      ++refused_;
      continue;
    }
    set_nodelay(fd);
    auto c = std::make_unique<Connection>();
    c->client_fd = fd;
    c->handshake_done = Clock::now() + seconds(2 * link().delay_s);
    Connection& ref = *c;
    conns_.push_back(std::move(c));
    try {
      ref.thread = std::thread([this, &ref] { run_connection(ref); });
      ++connections_;
    } catch (const std::system_error&) {  // out of threads: refuse rather than end the acceptor
      ::close(fd);
      conns_.pop_back();
      ++refused_;
    }
  }
}

void WanRelay::reap_finished() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->finished) {
      (*it)->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

int WanRelay::connect_target() {
  for (const auto& [addr, len] : target_addrs_) {
    int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int err = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      Clock::time_point deadline = Clock::now() + kConnectTimeout;
      pollfd p{fd, POLLOUT, 0};
      while (!stopping_ && Clock::now() < deadline && poll_until(&p, 1, deadline) == 0) {
      }
      socklen_t elen = sizeof err;
      if (!(p.revents & (POLLOUT | POLLERR | POLLHUP)) || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
        err = ETIMEDOUT;
    }
    if (err == 0) {
      set_nodelay(fd);
      return fd;
    }
    ::close(fd);
    if (stopping_) break;
  }
  return -1;
}

void WanRelay::run_connection(Connection& c) {
  int fd = connect_target();  // on failure the client is closed below: it reads EOF
  if (fd >= 0) {
    {
      std::lock_guard lock(conns_mu_);
      c.target_fd = fd;
    }
    try {
      std::thread down([this, &c] { pump(c, false); });
      pump(c, true);
      down.join();
    } catch (const std::system_error&) {  // no thread for the second direction: drop the pair
    }
  }
  std::lock_guard lock(conns_mu_);
  ::close(c.client_fd);
  if (c.target_fd >= 0) ::close(c.target_fd);
  c.client_fd = c.target_fd = -1;
  c.finished = true;
}

void WanRelay::pump(Connection& c, bool up) {
  const int src = up ? c.client_fd : c.target_fd, dst = up ? c.target_fd : c.client_fd;
  LinkDirection& dir = up ? up_ : down_;
  std::atomic<int64_t>& delivered = up ? bytes_up_ : bytes_down_;
  std::atomic<int64_t>& read_total = up ? read_up_ : read_down_;
  std::deque<Chunk> queue;
  size_t queued = 0;  // bytes read and not yet written
  bool src_eof = false;
  Clock::time_point last_release = c.handshake_done;  // keeps the byte order when set_link shrinks the delay
  std::vector<char> buf(kChunkBytes);
  while (!stopping_ && !c.failed) {
    Clock::time_point now = Clock::now();
    bool dst_full = false;
    while (!queue.empty() && queue.front().release <= now) {
      Chunk& ch = queue.front();
      if (ch.eof) {
        ::shutdown(dst, SHUT_WR);
        return;
      }
      ssize_t n = ::send(dst, ch.bytes.data() + ch.sent, ch.bytes.size() - ch.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        dst_full = true;
        break;
      }
      if (n < 0) return c.fail();  // EPIPE, ECONNRESET: the pair is done
      delivered += n;
      ch.sent += static_cast<size_t>(n);
      if (ch.sent == ch.bytes.size()) {
        queued -= ch.bytes.size();
        queue.pop_front();
      }
    }

    Clock::time_point wake = now + kPollSlice;
    if (!dst_full && !queue.empty()) wake = std::min(wake, queue.front().release);
    bool can_read = !src_eof && queued < kMaxQueuedBytes;
    if (can_read) {
      std::lock_guard lock(dir.mu);
      Clock::time_point room_at = dir.free_at - seconds(kMaxBacklogS);
      if (room_at > now) {
        can_read = false;
        wake = std::min(wake, room_at);
      }
    }
    pollfd p[2] = {{can_read ? src : -1, POLLIN, 0}, {dst_full ? dst : -1, POLLOUT, 0}};
    int r = poll_until(p, 2, wake);
    if (r < 0 && errno != EINTR) return c.fail();
    if (r <= 0 || p[0].revents == 0) continue;

    ssize_t n = ::recv(src, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n < 0) return c.fail();
    if (stopping_ || c.failed) return;  // the EOF may be stop()'s or fail()'s shutdown, not the peer's
    WanLinkOptions opt = link();
    Chunk ch;
    ch.eof = n == 0;
    src_eof = ch.eof;
    ch.bytes.assign(buf.data(), buf.data() + n);
    read_total += n;
    Clock::time_point sent_at;  // end of transmission
    {
      std::lock_guard lock(dir.mu);
      sent_at = std::max(Clock::now(), dir.free_at);
      if (opt.rate_bps > 0) sent_at += seconds(static_cast<double>(n) * 8 / opt.rate_bps);
      if (n > 0) dir.free_at = sent_at;  // an EOF (FIN) is too small to occupy the link
    }
    ch.release = std::max(std::max(sent_at, c.handshake_done) + seconds(opt.delay_s), last_release);
    last_release = ch.release;
    queued += ch.bytes.size();
    queue.push_back(std::move(ch));
  }
}

}  // namespace loom::bench
