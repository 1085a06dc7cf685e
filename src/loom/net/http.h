// HTTP/1.1 messages as the server handles them: the request head parser (with the limits
// that keep a hostile client from costing memory) and response serialization. No sockets.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::net {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: "/v1/models?x=1"
  std::string path;    // target without the query
  std::string query;
  int minor_version = 1;  // HTTP/1.<minor>
  HeaderList headers;     // names lower-cased, values trimmed
  int64_t content_length = 0;
  bool expect_continue = false;
  bool keep_alive = true;
  std::string body;

  // First header with this (lower-case) name.
  const std::string* header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HeaderList headers;  // extra headers
  std::string body;
  bool close = false;  // send Connection: close and end the connection
};

struct HttpLimits {
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = 1 << 20;
};

// Why a request head was refused, as the status and text to answer with.
struct HttpError {
  int status = 400;
  std::string message;
};

// Parses the request line and headers in `head` (everything before the blank line, CRLF or
// LF line ends). Checks Content-Length against limits.max_body_bytes (413) and refuses
// Transfer-Encoding request bodies (411). Returns nullopt and fills `err` on failure.
std::optional<HttpRequest> parse_request_head(std::string_view head, const HttpLimits& limits, HttpError* err);

// Where the head ends in `buf`: the offset just past the blank line, or npos.
size_t find_head_end(std::string_view buf);

const char* status_reason(int status);

// Status line and headers (ending with the blank line). content_length >= 0, or one of:
inline constexpr int64_t kChunked = -1;     // Transfer-Encoding: chunked
inline constexpr int64_t kUntilClose = -2;  // no length: the body ends when the connection closes
std::string response_head(int status, std::string_view content_type, int64_t content_length, bool close,
                          const HeaderList& extra);

std::string to_lower(std::string_view s);

}  // namespace loom::net
