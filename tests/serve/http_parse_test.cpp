// Request-head parsing, limits and response serialization of the HTTP layer.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/net/http.h"
#include "loom/serve/client/http_client.h"

using namespace loom::serve;
namespace net = loom::net;

namespace {
std::optional<net::HttpRequest> parse(const std::string& head, net::HttpError* err, size_t max_body = 1000) {
  net::HttpLimits lim;
  lim.max_body_bytes = max_body;
  return net::parse_request_head(head, lim, err);
}
}  // namespace

TEST(ServeHttpParse, RequestLineHeadersAndQuery) {
  net::HttpError err;
  auto r = parse("POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nX-Thing:  v  \r\n", &err);
  ASSERT_TRUE(r) << err.message;
  EXPECT_EQ(r->method, "POST");
  EXPECT_EQ(r->path, "/v1/completions");
  EXPECT_EQ(r->query, "x=1");
  EXPECT_EQ(r->content_length, 12);
  EXPECT_TRUE(r->keep_alive);
  ASSERT_NE(r->header("x-thing"), nullptr);
  EXPECT_EQ(*r->header("x-thing"), "v");
}

TEST(ServeHttpParse, ConnectionSemanticsPerVersion) {
  net::HttpError err;
  EXPECT_FALSE(parse("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n", &err)->keep_alive);
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n", &err)->keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n", &err)->keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n", &err)->expect_continue);
}

TEST(ServeHttpParse, RefusalsCarryTheRightStatus) {
  struct Case {
    const char* head;
    int status;
  } cases[] = {
      {"GARBAGE\r\n", 400},
      {"GET /x HTTP/2.0\r\n", 505},
      {"GET x HTTP/1.1\r\nHost: t\r\n", 400},
      {"GET /x HTTP/1.1\r\nHost: t\r\nBad Header\r\n", 400},
      {"GET /x HTTP/1.1\r\nHost: t\r\n folded: x\r\n", 400},
      {"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n", 400},
      {"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n", 400},
      {"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n", 411},
      {"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 1001\r\n", 413},
      {"POST /x HTTP/1.1\r\nHost: t\r\nExpect: something\r\n", 417},
      // RFC 9112: an HTTP/1.1 request has exactly one Host; a CR only ends a line.
      {"GET /x HTTP/1.1\r\n", 400},
      {"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n", 400},
      {"GET /x HTTP/1.0\r\nHost: a\r\nhost: b\r\n", 400},
      {"GET /x HTTP/1.1\r\nHost: t\r\nX-A: 1\rX-B: 2\r\n", 400},
      {"GET /x\r HTTP/1.1\r\nHost: t\r\n", 400},
      {"GET ftp://h/x HTTP/1.1\r\nHost: t\r\n", 400},
      {"GET http:///x HTTP/1.1\r\nHost: t\r\n", 400},
  };
  for (const auto& c : cases) {
    net::HttpError err;
    EXPECT_FALSE(parse(c.head, &err)) << c.head;
    EXPECT_EQ(err.status, c.status) << c.head;
    EXPECT_FALSE(err.message.empty());
  }
  net::HttpError err;
  EXPECT_TRUE(parse("POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n", &err));
}

TEST(ServeHttpParse, AbsoluteFormTargetsAndHostRules) {
  net::HttpError err;
  auto r = parse("GET http://example.test:8000/v1/models?x=1 HTTP/1.1\r\nHost: example.test:8000\r\n", &err);
  ASSERT_TRUE(r) << err.message;
  EXPECT_EQ(r->path, "/v1/models");
  EXPECT_EQ(r->query, "x=1");
  r = parse("GET HTTP://example.test HTTP/1.1\r\nHost: example.test\r\n", &err);
  ASSERT_TRUE(r) << err.message;
  EXPECT_EQ(r->path, "/");
  EXPECT_TRUE(parse("GET /health HTTP/1.0\r\n", &err)) << "HTTP/1.0 may omit Host";
  EXPECT_FALSE(parse("GET /health HTTP/1.1\r\n", &err));
  EXPECT_EQ(err.message, "an HTTP/1.1 request needs a Host header");
}

TEST(ServeHttpParse, HeadEndWithCrlfOrLf) {
  EXPECT_EQ(net::find_head_end("GET / HTTP/1.1\r\nA: b\r\n\r\nbody"), 24u);
  EXPECT_EQ(net::find_head_end("GET / HTTP/1.1\nA: b\n\nbody"), 21u);
  EXPECT_EQ(net::find_head_end("GET / HTTP/1.1\r\nA: b\r\n"), std::string::npos);
}

TEST(ServeHttpParse, ResponseHead) {
  std::string h = net::response_head(404, "application/json", 7, true, {{"X-A", "1"}});
  EXPECT_EQ(h.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u);
  EXPECT_NE(h.find("Content-Length: 7\r\n"), std::string::npos);
  EXPECT_NE(h.find("Connection: close\r\n"), std::string::npos);
  EXPECT_NE(h.find("X-A: 1\r\n"), std::string::npos);
  EXPECT_EQ(h.substr(h.size() - 4), "\r\n\r\n");
  std::string chunked = net::response_head(200, "text/event-stream", -1, false, {});
  EXPECT_NE(chunked.find("Transfer-Encoding: chunked\r\n"), std::string::npos);
  EXPECT_EQ(chunked.find("Content-Length"), std::string::npos);
}

TEST(ServeHttpParse, Urls) {
  Url u = parse_url("http://127.0.0.1:8123/v1/");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 8123);
  EXPECT_EQ(u.prefix, "/v1");
  Url v = parse_url("http://[::1]:9000");
  EXPECT_EQ(v.host, "::1");
  EXPECT_EQ(v.port, 9000);
  EXPECT_EQ(parse_url("localhost").port, 80);
  EXPECT_THROW(parse_url("https://x"), loom::Error);
  EXPECT_THROW(parse_url("http://x:port"), loom::Error);
}
