// Blocking HTTP/1.1 client (see http_client.h).
#include "loom/serve/client/http_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loom/core/error.h"

namespace loom::serve {

Url parse_url(const std::string& url) {
  Url u;
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0)
    rest = rest.substr(7);
  else if (rest.find("://") != std::string::npos)
    fail("url", url, ": only http:// URLs are supported");
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos) u.prefix = rest.substr(slash);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  std::string port;
  if (!hostport.empty() && hostport[0] == '[') {  // [v6addr]:port
    size_t close = hostport.find(']');
    LOOM_CHECK(close != std::string::npos, "url", url, ": unterminated [IPv6] host");
    if (close + 1 < hostport.size() && hostport[close + 1] == ':') port = hostport.substr(close + 2);
    hostport = hostport.substr(1, close - 1);
  } else if (size_t colon = hostport.rfind(':'); colon != std::string::npos) {
    port = hostport.substr(colon + 1);
    hostport = hostport.substr(0, colon);
  }
  if (!port.empty()) {
    if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5)
      fail("url", url, ": the port must be a number");
    u.port = std::stoi(port);
  }
  LOOM_CHECK(!hostport.empty(), "url", url, ": no host (expected http://HOST:PORT)");
  u.host = hostport;
  return u;
}

const std::string* ClientResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

HttpClient::HttpClient(std::string host, int port, double timeout_s)
    : host_(std::move(host)), port_(port), timeout_s_(timeout_s) {}

HttpClient::~HttpClient() { close(); }

void HttpClient::connect() {
  close();
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string port = std::to_string(port_);
  int rc = ::getaddrinfo(host_.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) fail("http-client", "cannot resolve ", host_, ": ", gai_strerror(rc));
  std::string err = "no address";
  for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      fd_ = fd;
    } else {
      err = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) fail("http-client", "cannot connect to ", host_, ":", port_, ": ", err);
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  in_.clear();
  body_done_ = true;
}

bool HttpClient::drop_if_stale() {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) == 0 && in_.empty()) return false;
  close();
  return true;
}

void HttpClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void HttpClient::send_raw(std::string_view bytes) {
  if (fd_ < 0) connect();
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("http-client", "send to ", host_, ":", port_, " failed: ", std::strerror(errno));
    bytes.remove_prefix(size_t(n));
  }
}

bool HttpClient::fill() {
  LOOM_CHECK(fd_ >= 0, "http-client", "not connected");
  pollfd p{fd_, POLLIN, 0};
  int r;
  do r = ::poll(&p, 1, int(timeout_s_ * 1000));
  while (r < 0 && errno == EINTR);
  if (r == 0) fail("http-client", "no answer from ", host_, ":", port_, " within ", timeout_s_, " s");
  char buf[16384];
  ssize_t n;
  do n = ::recv(fd_, buf, sizeof buf, 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  in_.append(buf, size_t(n));
  return true;
}

std::string HttpClient::read_line() {
  size_t nl;
  while ((nl = in_.find('\n')) == std::string::npos)
    if (!fill()) fail("http-client", "connection closed in the middle of a response");
  std::string line = in_.substr(0, nl);
  in_.erase(0, nl + 1);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

std::string HttpClient::read_exact(size_t n) {
  while (in_.size() < n)
    if (!fill()) fail("http-client", "connection closed in the middle of a body");
  std::string out = in_.substr(0, n);
  in_.erase(0, n);
  return out;
}

ClientResponse HttpClient::read_head() {
  ClientResponse r;
  for (;;) {
    std::string status = read_line();
    LOOM_CHECK(status.rfind("HTTP/1.", 0) == 0 && status.size() >= 12, "http-client", "bad status line: ", status);
    r.status = std::stoi(status.substr(9, 3));
    r.headers.clear();
    for (std::string line = read_line(); !line.empty(); line = read_line()) {
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string v = line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      r.headers.emplace_back(net::to_lower(line.substr(0, colon)), v);
    }
    if (r.status != 100) break;  // interim response: the real one follows
  }
  const std::string* te = r.header("transfer-encoding");
  const std::string* cl = r.header("content-length");
  const std::string* conn = r.header("connection");
  close_after_ = conn && net::to_lower(*conn) == "close";
  if (te && net::to_lower(*te).find("chunked") != std::string::npos) {
    mode_ = BodyMode::chunked;
  } else if (cl) {
    mode_ = BodyMode::length;
    remaining_ = std::stoll(*cl);
  } else {
    mode_ = BodyMode::until_close;
  }
  body_done_ = false;
  sse_buf_.clear();
  return r;
}

std::string HttpClient::read_body_piece() {
  if (body_done_) return "";
  std::string out;
  if (mode_ == BodyMode::length) {
    if (remaining_ > 0) {
      if (in_.empty() && !fill()) fail("http-client", "connection closed in the middle of a body");
      size_t n = std::min<size_t>(in_.size(), size_t(remaining_));
      out = in_.substr(0, n);
      in_.erase(0, n);
      remaining_ -= int64_t(n);
    }
    if (remaining_ == 0) body_done_ = true;
  } else if (mode_ == BodyMode::chunked) {
    std::string size_line = read_line();
    size_t n = std::stoul(size_line, nullptr, 16);
    if (n == 0) {
      while (!read_line().empty()) {
      }  // trailers
      body_done_ = true;
    } else {
      out = read_exact(n);
      read_line();
    }
  } else {
    if (in_.empty() && !fill()) body_done_ = true;
    out = std::exchange(in_, {});
  }
  if (body_done_ && (close_after_ || mode_ == BodyMode::until_close)) close();
  return out;
}

int HttpClient::read_interim() {
  const std::string status = read_line();
  LOOM_CHECK(status.rfind("HTTP/1.", 0) == 0 && status.size() >= 12, "http-client", "bad status line: ", status);
  while (!read_line().empty()) {
  }
  return std::stoi(status.substr(9, 3));
}

ClientResponse HttpClient::read_response() {
  ClientResponse r = read_head();
  while (!body_done_) r.body += read_body_piece();
  return r;
}

std::string HttpClient::build(const std::string& method, const std::string& path, const std::string& body,
                              const net::HeaderList& headers) const {
  std::string msg = str_cat(method, " ", path, " HTTP/1.1\r\nHost: ", host_, ":", port_, "\r\n");
  bool has_type = false;
  for (const auto& [k, v] : headers) {
    msg += str_cat(k, ": ", v, "\r\n");
    if (net::to_lower(k) == "content-type") has_type = true;
  }
  if (!body.empty() && !has_type) msg += "Content-Type: application/json\r\n";
  if (!body.empty() || method == "POST") msg += str_cat("Content-Length: ", body.size(), "\r\n");
  return msg + "\r\n" + body;
}

ClientResponse HttpClient::request(const std::string& method, const std::string& path, const std::string& body,
                                   const net::HeaderList& headers) {
  if (fd_ < 0 || !body_done_) connect();
  send_raw(build(method, path, body, headers));
  return read_response();
}

ClientResponse HttpClient::start_stream(const std::string& method, const std::string& path, const std::string& body,
                                        const net::HeaderList& headers) {
  if (fd_ < 0 || !body_done_) connect();
  send_raw(build(method, path, body, headers));
  return read_head();
}

std::optional<std::string> HttpClient::next_event() {
  for (;;) {
    size_t end = sse_buf_.find("\n\n");
    if (end != std::string::npos) {
      std::string event = sse_buf_.substr(0, end);
      sse_buf_.erase(0, end + 2);
      std::string data;
      size_t pos = 0;
      while (pos <= event.size()) {
        size_t nl = event.find('\n', pos);
        if (nl == std::string::npos) nl = event.size();
        std::string line = event.substr(pos, nl - pos);
        if (line.rfind("data:", 0) == 0) {
          std::string v = line.substr(5);
          if (!v.empty() && v[0] == ' ') v.erase(0, 1);
          data += data.empty() ? v : "\n" + v;
        }
        pos = nl + 1;
      }
      return data;
    }
    if (body_done_) return std::nullopt;
    std::string piece = read_body_piece();
    for (char c : piece)
      if (c != '\r') sse_buf_ += c;
  }
}

}  // namespace loom::serve
