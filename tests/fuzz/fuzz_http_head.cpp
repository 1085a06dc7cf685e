// libFuzzer target: the HTTP request head and body framing the server applies to bytes from a
// socket (find_head_end, then parse_request_head, then Content-Length framing). Any input may
// be refused with an HttpError, never crash, and a parsed request must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loom/net/http.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::net;
  std::string_view buf(reinterpret_cast<const char*>(data), size);
  // The server strips empty lines before a request, then looks for the head's end.
  const size_t lead = buf.find_first_not_of("\r\n");
  if (lead == std::string_view::npos) return 0;
  buf.remove_prefix(lead);
  const size_t head_end = find_head_end(buf);
  if (head_end == std::string_view::npos) return 0;
  if (head_end > buf.size()) __builtin_trap();
  HttpLimits limits;
  limits.max_body_bytes = 4096;
  HttpError err;
  auto req = parse_request_head(buf.substr(0, head_end), limits, &err);
  if (!req) {
    if (err.status < 400 || err.status > 599 || err.message.empty()) __builtin_trap();
    return 0;
  }
  if (req->content_length < 0 || size_t(req->content_length) > limits.max_body_bytes) __builtin_trap();
  if (req->path.empty() || req->path[0] != '/' || req->method.empty()) __builtin_trap();
  const std::string_view rest = buf.substr(head_end);
  if (rest.size() >= size_t(req->content_length)) {
    const std::string body(rest.substr(0, size_t(req->content_length)));
    if (body.size() != size_t(req->content_length)) __builtin_trap();
  }
  return 0;
}
