// Socket side of one HTTP connection: the per-connection loop, response writing, closing.
// Each connection thread owns its socket and is the only one that reads or writes it.
// Every close the server starts is a lingering close (RFC 9112 section 9.6): our side ends
// first and what the client still sends is read and dropped, because closing a socket with
// unread bytes makes the kernel send a reset, which can destroy a response in flight. An idle
// connection closed by stop() owes nothing: it lingers only until the client has acknowledged
// every byte sent to it, so that idle keep-alive clients do not hold up the exit.
#include "loom/net/http_connection.h"

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

namespace loom::net {

namespace {
constexpr double kLingerS = 2.0;                   // a lingering close waits this long for the client's FIN
constexpr double kStopReadS = 1.0;                 // after stop() begins: the most a request under way, or
                                                   // a lingering close, may still take
constexpr size_t kLingerBytes = size_t(64) << 20;  // a lingering close drops at most this
}  // namespace

// ---------------------------------------------------------------- HttpExchange

void HttpExchange::respond(const HttpResponse& r) {
  LOOM_CHECK(state_ == State::fresh, "http", "a response was already sent for ", req_.path);
  status_ = r.status;
  close_ = r.close || !req_.keep_alive || conn_.closing();
  std::string msg = response_head(r.status, r.content_type, int64_t(r.body.size()), close_, r.headers);
  msg += r.body;
  finish();
  state_ = conn_.send_all(msg) ? State::done : State::broken;
}

void HttpExchange::finish() {
  if (!on_finish_) return;
  auto fn = std::move(on_finish_);
  on_finish_ = nullptr;
  fn(status_);
}

bool HttpExchange::start_stream(int status, std::string_view content_type, const HeaderList& extra) {
  LOOM_CHECK(state_ == State::fresh, "http", "a response was already sent for ", req_.path);
  status_ = status;
  chunked_ = req_.minor_version >= 1;
  close_ = !req_.keep_alive || !chunked_ || conn_.closing();
  std::string head = response_head(status, content_type, chunked_ ? kChunked : kUntilClose, close_, extra);
  state_ = conn_.send_all(head) ? State::streaming : State::broken;
  return state_ == State::streaming;
}

bool HttpExchange::send_chunk(std::string_view data) {
  if (state_ != State::streaming) return false;
  if (data.empty()) return true;  // an empty chunk would end the body
  if (!chunked_) {
    if (!conn_.send_all(data)) state_ = State::broken;
    return state_ == State::streaming;
  }
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string msg = size;
  msg.append(data);
  msg += "\r\n";
  if (!conn_.send_all(msg)) state_ = State::broken;
  return state_ == State::streaming;
}

void HttpExchange::end_stream() {
  if (state_ != State::streaming) return;
  finish();
  state_ = !chunked_ || conn_.send_all("0\r\n\r\n") ? State::done : State::broken;
}

void HttpExchange::abandon() {
  if (state_ == State::fresh) status_ = 499;
  state_ = State::broken;
}

bool HttpExchange::client_gone() {
  if (state_ == State::broken) return true;
  return conn_.peer_gone();
}

bool HttpExchange::keeps_connection() const { return state_ == State::done && !close_; }

// ---------------------------------------------------------------- Connection

bool Connection::send_all(std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;  // EPIPE, ECONNRESET, or EAGAIN after SO_SNDTIMEO: the client is gone
    }
    data.remove_prefix(size_t(n));
  }
  return true;
}

bool Connection::peer_gone() {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

Connection::Read Connection::read_more(double deadline, bool idle) {
  char tmp[16384];
  for (;;) {
    if (stop_seen_) deadline = std::min(deadline, stop_deadline_);
    double left = deadline - now_seconds();
    if (left <= 0) return Read::timeout;
    // Until stop() begins its signal is polled too (it stays readable, so only until seen).
    pollfd p[2] = {{fd_, POLLIN, 0}, {server_.stop_fd(), POLLIN, 0}};
    int r = ::poll(p, stop_seen_ ? 1 : 2, int(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Read::eof;
    if (!stop_seen_ && p[1].revents) {
      stop_seen_ = true;
      stop_deadline_ = now_seconds() + kStopReadS;
    }
    if (p[0].revents == 0) {
      // Nothing to read: an idle connection ends at stop; a request under way may finish.
      if (stop_seen_ && idle) return Read::stopping;
      continue;  // re-check the deadline
    }
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Read::eof;
    buf_.append(tmp, size_t(n));
    return Read::data;
  }
}

// Sends an error; the connection then closes (lingering, as every close).
void Connection::refuse(int status, const std::string& message) {
  HttpResponse r = server_.render_error(status, message);
  r.close = true;
  send_all(response_head(r.status, r.content_type, int64_t(r.body.size()), true, r.headers) + r.body);
}

bool Connection::unacknowledged_output() {
  int n = 0;
  return ::ioctl(fd_, SIOCOUTQ, &n) != 0 || n > 0;
}

void Connection::linger() {
  ::shutdown(fd_, SHUT_WR);
  const double deadline = now_seconds() + kLingerS;
  size_t drained = 0;
  buf_.clear();
  while (drained < kLingerBytes) {
    if (idle_at_stop_ && !unacknowledged_output()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 0) == 0) return;  // nothing unread either: the close sends no reset
    }
    // Idle at stop: re-check the acknowledgements every few milliseconds.
    const Read r = read_more(idle_at_stop_ ? std::min(deadline, now_seconds() + 0.005) : deadline, false);
    if (r == Read::data) {
      drained += buf_.size();
      buf_.clear();
    } else if (r != Read::timeout || !idle_at_stop_ || now_seconds() >= deadline) {
      return;
    }
  }
}

void Connection::run() {
  const HttpServerOptions& opt = server_.options();
  for (;;) {
    double idle_deadline = now_seconds() + opt.idle_timeout_s, request_deadline = 0;
    size_t head_end;
    waiting_since_ = now_seconds();
    for (;;) {
      // Empty lines before a request are ignored (RFC 9112 section 2.2), in one erase.
      if (const size_t lead = buf_.find_first_not_of("\r\n"); lead != 0)
        buf_.erase(0, lead == std::string::npos ? buf_.size() : lead);
      head_end = find_head_end(buf_);
      if (head_end != std::string::npos) break;
      if (buf_.size() > opt.limits.max_header_bytes)
        return refuse(431, str_cat("request head exceeds ", opt.limits.max_header_bytes, " bytes"));
      if (!buf_.empty() && request_deadline == 0) request_deadline = now_seconds() + opt.read_timeout_s;
      Read r = read_more(buf_.empty() ? idle_deadline : request_deadline, buf_.empty());
      if (r == Read::stopping) idle_at_stop_ = true;
      if (r == Read::eof || r == Read::stopping) return;
      if (r == Read::timeout) {
        if (!buf_.empty()) refuse(408, "request head not received in time");
        return;
      }
    }
    // The head is complete: no longer a candidate for eviction, unless it was just chosen.
    if (double w = waiting_since_.load(); w < 0 || !waiting_since_.compare_exchange_strong(w, 0.0)) return;
    if (head_end > opt.limits.max_header_bytes)
      return refuse(431, str_cat("request head exceeds ", opt.limits.max_header_bytes, " bytes"));
    if (request_deadline == 0) request_deadline = now_seconds() + opt.read_timeout_s;

    HttpError err;
    auto req = parse_request_head(std::string_view(buf_).substr(0, head_end), opt.limits, &err);
    if (!req) return refuse(err.status, err.message);
    size_t need = head_end + size_t(req->content_length);
    if (req->expect_continue && buf_.size() < need && !send_all("HTTP/1.1 100 Continue\r\n\r\n")) return;
    while (buf_.size() < need) {
      Read r = read_more(request_deadline, false);
      if (r == Read::eof) return;
      if (r == Read::timeout) return refuse(408, "request body not received in time");
    }
    req->body = buf_.substr(head_end, size_t(req->content_length));
    buf_.erase(0, need);

    const double started = now_seconds();
    HttpExchange ex(*this, std::move(*req));
    std::string failure;
    try {
      server_.handle(ex);
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "an exception that is not a std::exception";
    }
    if (!failure.empty() || !ex.responded()) {
      // The cause goes to the log under an id; the client gets the id, never the text.
      const std::string id = server_.next_error_id();
      std::fprintf(stderr, "[serve] error %s: %s %s: %s\n", id.c_str(), ex.request().method.c_str(),
                   ex.request().path.c_str(), failure.empty() ? "the handler produced no response" : failure.c_str());
      if (ex.responded()) {
        log_access(ex, started);
        return;  // a stream broke half-way: the connection's state is unknown
      }
      ex.respond(server_.render_error(
          500, str_cat("internal server error (error id ", id, "; the server log has the cause)")));
    }
    log_access(ex, started);
    if (!ex.keeps_connection()) return;
  }
}

void Connection::log_access(const HttpExchange& ex, double started) const {
  if (!server_.options().access_log) return;
  const HttpRequest& r = ex.request();
  std::fprintf(stderr, "[access] %s %s %d %.1f ms%s%s\n", r.method.c_str(), r.path.c_str(), ex.status(),
               (now_seconds() - started) * 1e3, ex.noted().empty() ? "" : " ", ex.noted().c_str());
}

}  // namespace loom::net
