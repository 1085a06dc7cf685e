// A minimal blocking HTTP/1.1 client for loom's own tests and `loom bench serve`: one
// connection, Content-Length or chunked bodies, and server-sent events read one by one.
// Not a general-purpose client (no TLS, no redirects, no proxies).
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "loom/net/http.h"

namespace loom::serve {

// http://host:port[/prefix]; the prefix (e.g. "/v1") is kept for the caller to prepend.
struct Url {
  std::string host;
  int port = 80;
  std::string prefix;
};
Url parse_url(const std::string& url);  // throws loom::Error naming the URL

struct ClientResponse {
  int status = 0;
  net::HeaderList headers;  // names lower-cased
  std::string body;
  const std::string* header(std::string_view name) const;
};

class HttpClient {
 public:
  HttpClient(std::string host, int port, double timeout_s = 30);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  void connect();  // throws loom::Error; request() connects on demand
  void close();
  bool connected() const { return fd_ >= 0; }
  // An idle kept-alive connection the server has closed (or sent something unasked on):
  // readable with nothing requested. Closes it and returns true; false while it is usable.
  bool drop_if_stale();

  ClientResponse request(const std::string& method, const std::string& path, const std::string& body = "",
                         const net::HeaderList& headers = {});
  // Sends exactly these bytes (for tests of malformed requests), then read_response().
  void send_raw(std::string_view bytes);
  ClientResponse read_response();
  // Reads one interim response's head (e.g. 100 Continue) and returns its status; throws if
  // none arrives within the timeout. For tests of Expect: 100-continue.
  int read_interim();

  // Sends a request and reads only the response head; then next_event() yields each SSE
  // `data:` payload ("[DONE]" included) until the body ends (nullopt).
  ClientResponse start_stream(const std::string& method, const std::string& path, const std::string& body,
                              const net::HeaderList& headers = {});
  std::optional<std::string> next_event();

 private:
  enum class BodyMode { length, chunked, until_close };
  bool fill();  // reads more bytes; false at EOF
  std::string read_line();
  std::string read_exact(size_t n);
  ClientResponse read_head();
  // Next piece of the decoded body; empty at its end.
  std::string read_body_piece();
  std::string build(const std::string& method, const std::string& path, const std::string& body,
                    const net::HeaderList& headers) const;

  std::string host_;
  int port_;
  double timeout_s_;
  int fd_ = -1;
  std::string in_;
  BodyMode mode_ = BodyMode::length;
  int64_t remaining_ = 0;  // length mode: body bytes still to read
  bool body_done_ = true;
  bool close_after_ = false;
  std::string sse_buf_;
};

}  // namespace loom::serve
