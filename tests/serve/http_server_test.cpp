// HttpServer on its own (no OpenAI layer): slow clients cannot lock others out, a handler's
// exception text never reaches the client, leading empty lines cost linear time, and each
// answered request leaves one access-log line.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <vector>

#include "loom/core/timer.h"
#include "loom/net/http_server.h"
#include "loom/serve/client/http_client.h"

namespace loom::serve {
namespace {

class HttpServerTest : public ::testing::Test {
 protected:
  void start(net::HttpServerOptions opt = {}) {
    opt.host = "127.0.0.1";
    opt.port = 0;
    server_ = std::make_unique<net::HttpServer>(opt, [](net::HttpExchange& ex) {
      const std::string& path = ex.request().path;
      if (path == "/throw") throw std::runtime_error("secret detail of the failure");
      if (path == "/silent") return;  // no response at all
      net::HttpResponse r;
      r.content_type = "text/plain";
      r.body = "ok " + path;
      ex.note("tokens=3+4");
      ex.respond(r);
    });
    server_->start();
  }
  std::unique_ptr<HttpClient> client(double timeout_s = 5) {
    return std::make_unique<HttpClient>("127.0.0.1", server_->port(), timeout_s);
  }
  void TearDown() override {
    if (server_) server_->stop();
  }
  std::unique_ptr<net::HttpServer> server_;
};

TEST_F(HttpServerTest, SlowClientsFillingTheServerDoNotLockOthersOut) {
  net::HttpServerOptions opt;
  opt.max_connections = 8;
  opt.read_timeout_s = 30;  // the slow heads would hold their slots for this long
  start(opt);
  std::vector<std::unique_ptr<HttpClient>> slow;
  for (int i = 0; i < opt.max_connections; ++i) {
    slow.push_back(client());
    slow.back()->send_raw("GET /health HTTP/1.1\r\nHost: x\r\n");  // never finished
  }
  for (int i = 0; i < 100 && server_->open_connections() < opt.max_connections; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(server_->open_connections(), opt.max_connections);
  // Each new client makes room by closing the connection that has waited longest for its head.
  for (int i = 0; i < 3; ++i) {
    ClientResponse r = client()->request("GET", "/health");
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "ok /health");
  }
  EXPECT_GE(server_->evicted_connections(), 1);
}

TEST_F(HttpServerTest, AFullServerOfBusyConnectionsStillRefusesWith503) {
  // Connections whose requests are being handled are never evicted.
  net::HttpServerOptions opt;
  opt.max_connections = 2;
  std::atomic<int> inside{0};
  std::atomic<bool> release{false};
  opt.host = "127.0.0.1";
  opt.port = 0;
  server_ = std::make_unique<net::HttpServer>(opt, [&](net::HttpExchange& ex) {
    ++inside;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    net::HttpResponse r;
    r.body = "done";
    ex.respond(r);
  });
  server_->start();
  auto a = client(), b = client();
  a->send_raw("GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  b->send_raw("GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  for (int i = 0; i < 200 && inside < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(inside, 2);
  EXPECT_EQ(client()->request("GET", "/c").status, 503);
  EXPECT_EQ(server_->evicted_connections(), 0);
  release = true;
  EXPECT_EQ(a->read_response().status, 200);
  EXPECT_EQ(b->read_response().status, 200);
}

TEST_F(HttpServerTest, ExceptionTextStaysInTheLog) {
  start();
  ::testing::internal::CaptureStderr();
  ClientResponse r = client()->request("GET", "/throw");
  ClientResponse none = client()->request("GET", "/silent");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.body.find("secret detail"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("error id"), std::string::npos) << r.body;
  EXPECT_NE(log.find("secret detail of the failure"), std::string::npos) << log;
  // The id in the body is the one in the log line.
  const size_t at = r.body.find("error id ") + 9;
  const std::string id = r.body.substr(at, r.body.find(';', at) - at);
  EXPECT_NE(log.find("[serve] error " + id + ": GET /throw"), std::string::npos) << log;
  EXPECT_EQ(none.status, 500);
  EXPECT_NE(log.find("the handler produced no response"), std::string::npos) << log;
}

TEST_F(HttpServerTest, ManyEmptyLinesBeforeARequestCostLinearTime) {
  start();
  auto c = client(10);
  const std::string blank(size_t(8) << 20, '\n');  // 8 MiB of empty lines
  const double t = now_seconds();
  c->send_raw(blank);
  c->send_raw("GET /after-blank HTTP/1.1\r\nHost: x\r\n\r\n");
  ClientResponse r = c->read_response();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok /after-blank");
  EXPECT_LT(now_seconds() - t, 3.0);  // one erase per read; byte by byte took minutes
}

TEST_F(HttpServerTest, AccessLogHasOneLinePerRequestUnlessOff) {
  // The line is written after the response went out; a second request on the same
  // connection is answered only after it.
  start();
  ::testing::internal::CaptureStderr();
  auto c = client();
  EXPECT_EQ(c->request("GET", "/logged").status, 200);
  EXPECT_EQ(c->request("GET", "/second").status, 200);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("[access] GET /logged 200 "), std::string::npos) << log;
  EXPECT_NE(log.find(" ms tokens=3+4"), std::string::npos) << log;
  server_->stop();

  net::HttpServerOptions quiet;
  quiet.access_log = false;
  start(quiet);
  ::testing::internal::CaptureStderr();
  c = client();
  EXPECT_EQ(c->request("GET", "/quiet").status, 200);
  EXPECT_EQ(c->request("GET", "/second").status, 200);
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("[access]"), std::string::npos) << log;
}

}  // namespace
}  // namespace loom::serve
