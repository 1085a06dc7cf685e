// HTTP/1.1 request head parsing and response serialization (RFC 9112).
#include "loom/net/http.h"

#include <ctime>

#include "loom/core/error.h"

namespace loom::net {

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

size_t find_head_end(std::string_view buf) {
  // Accept bare LF line ends too (RFC 9112 section 2.2 allows recipients to).
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != '\n') continue;
    if (i + 1 < buf.size() && buf[i + 1] == '\n') return i + 2;
    if (i + 2 < buf.size() && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
  }
  return std::string_view::npos;
}

namespace {

bool is_token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::optional<HttpRequest> refuse(HttpError* err, int status, std::string msg) {
  err->status = status;
  err->message = std::move(msg);
  return std::nullopt;
}

bool has_token(std::string_view list, std::string_view token) {
  std::string lower = to_lower(list);
  size_t pos = 0;
  while (pos <= lower.size()) {
    size_t comma = lower.find(',', pos);
    if (comma == std::string::npos) comma = lower.size();
    if (trim(std::string_view(lower).substr(pos, comma - pos)) == token) return true;
    pos = comma + 1;
  }
  return false;
}

}  // namespace

std::optional<HttpRequest> parse_request_head(std::string_view head, const HttpLimits& limits, HttpError* err) {
  HttpRequest req;
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < head.size()) {
    size_t nl = head.find('\n', pos);
    if (nl == std::string_view::npos) nl = head.size();
    std::string_view line = head.substr(pos, nl - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // A CR anywhere else is a bare CR (RFC 9112 section 2.2: reject, or it may smuggle a line).
    if (line.find('\r') != std::string_view::npos) return refuse(err, 400, "bare CR in the request head");
    pos = nl + 1;
    if (line.empty()) {
      if (lines.empty()) continue;  // RFC 9112 2.2: ignore empty lines before the request line
      break;
    }
    lines.push_back(line);
  }
  if (lines.empty()) return refuse(err, 400, "empty request");

  // Request line: method SP target SP HTTP/1.x
  std::string_view rl = lines[0];
  size_t sp1 = rl.find(' '), sp2 = rl.rfind(' ');
  if (sp1 == std::string_view::npos || sp1 == sp2) return refuse(err, 400, "malformed request line");
  req.method = std::string(rl.substr(0, sp1));
  req.target = std::string(rl.substr(sp1 + 1, sp2 - sp1 - 1));
  std::string_view version = rl.substr(sp2 + 1);
  if (req.method.empty() || req.target.empty() || req.target.find(' ') != std::string::npos)
    return refuse(err, 400, "malformed request line");
  for (char c : req.method)
    if (!is_token_char(c)) return refuse(err, 400, "malformed method");
  if (version == "HTTP/1.1") {
    req.minor_version = 1;
  } else if (version == "HTTP/1.0") {
    req.minor_version = 0;
  } else if (version.rfind("HTTP/", 0) == 0) {
    return refuse(err, 505, str_cat("HTTP version ", version, " is not supported; use HTTP/1.1"));
  } else {
    return refuse(err, 400, "malformed request line");
  }
  // origin-form (/path?query), or absolute-form (http://authority/path?query), which a server
  // must accept (RFC 9112 section 3.2.2): its path and query are used, the authority ignored.
  std::string_view target = req.target;
  if (target[0] != '/') {
    const std::string lower = to_lower(target.substr(0, 8));
    const size_t scheme = lower.rfind("http://", 0) == 0 ? 7 : lower.rfind("https://", 0) == 0 ? 8 : 0;
    if (scheme == 0 || target.size() <= scheme)
      return refuse(err, 400, "request target must be an absolute path (/v1/...) or an absolute URL");
    const size_t slash = target.find_first_of("/?", scheme);
    if (slash == scheme) return refuse(err, 400, "request target URL has no host");
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  size_t q = target.find('?');
  req.path = std::string(target.substr(0, q));
  if (req.path.empty()) req.path = "/";
  if (q != std::string_view::npos) req.query = std::string(target.substr(q + 1));

  bool seen_length = false;
  int hosts = 0;
  req.keep_alive = req.minor_version == 1;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    if (line[0] == ' ' || line[0] == '\t') return refuse(err, 400, "obsolete header line folding");
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return refuse(err, 400, "malformed header line");
    std::string_view name = line.substr(0, colon);
    for (char c : name)
      if (!is_token_char(c)) return refuse(err, 400, "malformed header name");
    std::string lname = to_lower(name);
    std::string value(trim(line.substr(colon + 1)));
    if (lname == "content-length") {
      if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos)
        return refuse(err, 400, "Content-Length must be a decimal number");
      int64_t n = std::stoll(value);
      if (seen_length && n != req.content_length) return refuse(err, 400, "conflicting Content-Length headers");
      seen_length = true;
      req.content_length = n;
    } else if (lname == "transfer-encoding") {
      return refuse(err, 411, "chunked request bodies are not supported; send Content-Length");
    } else if (lname == "connection") {
      if (has_token(value, "close"))
        req.keep_alive = false;
      else if (has_token(value, "keep-alive"))
        req.keep_alive = true;
    } else if (lname == "host") {
      ++hosts;
    } else if (lname == "expect") {
      if (to_lower(value) != "100-continue") return refuse(err, 417, "only Expect: 100-continue is supported");
      req.expect_continue = true;
    }
    req.headers.emplace_back(std::move(lname), std::move(value));
  }
  // RFC 9112 section 3.2: an HTTP/1.1 request carries exactly one Host header; none or
  // several is a 400 (HTTP/1.0 clients may leave it out).
  if (hosts > 1 || (hosts == 0 && req.minor_version == 1))
    return refuse(err, 400, hosts ? "more than one Host header" : "an HTTP/1.1 request needs a Host header");
  if (size_t(req.content_length) > limits.max_body_bytes)
    return refuse(err, 413,
                  str_cat("request body of ", req.content_length, " bytes exceeds the limit of ", limits.max_body_bytes,
                          " bytes"));
  return req;
}

const char* status_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
  }
  return "Unknown";
}

std::string response_head(int status, std::string_view content_type, int64_t content_length, bool close,
                          const HeaderList& extra) {
  char date[64];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  std::string h = str_cat("HTTP/1.1 ", status, " ", status_reason(status), "\r\nServer: loom\r\nDate: ", date, "\r\n");
  if (!content_type.empty()) h += str_cat("Content-Type: ", content_type, "\r\n");
  if (content_length >= 0)
    h += str_cat("Content-Length: ", content_length, "\r\n");
  else if (content_length == kChunked)
    h += "Transfer-Encoding: chunked\r\n";
  h += close ? "Connection: close\r\n" : "Connection: keep-alive\r\n";
  for (const auto& [k, v] : extra) h += str_cat(k, ": ", v, "\r\n");
  h += "\r\n";
  return h;
}

}  // namespace loom::net
