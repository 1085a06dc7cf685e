// Every row of the error table in docs/SERVING.md over raw HTTP: status, OpenAI error object
// and the field it names; and none of them disturbs a stream running at the same time.
#include "loom/core/timer.h"
#include "serve/server_fixture.h"

namespace loom::serve::testing {
namespace {

struct ErrorCase {
  const char* what;
  std::string request;  // raw bytes
  int status;
  const char* type;
  const char* param;  // nullptr: null
};

std::vector<ErrorCase> error_cases() {
  auto completion = [](const std::string& body) { return raw_post("/v1/completions", body); };
  auto chat = [](const std::string& body) { return raw_post("/v1/chat/completions", body); };
  const char* ir = "invalid_request_error";
  return {
      {"malformed JSON", completion(R"({"model": "fake", "prompt": )"), 400, ir, nullptr},
      {"body not an object", completion("[]"), 400, ir, nullptr},
      {"deeply nested JSON", completion(std::string(100000, '[') + std::string(100000, ']')), 400, ir, nullptr},
      {"missing prompt", completion(R"({"model": "fake"})"), 400, ir, "prompt"},
      {"missing model", completion(R"({"prompt": "x"})"), 400, ir, "model"},
      {"missing messages", chat(R"({"model": "fake"})"), 400, ir, "messages"},
      {"wrongly typed max_tokens", completion(R"({"model": "fake", "prompt": "x", "max_tokens": "3"})"), 400, ir,
       "max_tokens"},
      {"wrongly typed stream", completion(R"({"model": "fake", "prompt": "x", "stream": 1})"), 400, ir, "stream"},
      {"negative max_tokens", completion(R"({"model": "fake", "prompt": "x", "max_tokens": -4})"), 400, ir,
       "max_tokens"},
      {"absurd max_tokens", completion(R"({"model": "fake", "prompt": "x", "max_tokens": 99999999999})"), 400, ir,
       "max_tokens"},
      {"temperature out of range", completion(R"({"model": "fake", "prompt": "x", "temperature": 3})"), 400, ir,
       "temperature"},
      {"top_p out of range", completion(R"({"model": "fake", "prompt": "x", "top_p": 1.01})"), 400, ir, "top_p"},
      {"prompt beyond the context", completion(R"({"model": "fake", "prompt": ")" + std::string(300, 'a') + R"("})"),
       400, ir, "prompt"},
      {"unknown model", completion(R"({"model": "gpt-9", "prompt": "x"})"), 400, ir, "model"},
      {"n > 1", chat(R"({"model": "fake", "messages": [{"role": "user", "content": "x"}], "n": 3})"), 400, ir, "n"},
      {"oversized body", "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 5000000\r\n\r\n", 413, ir,
       nullptr},
      {"unknown route", "GET /v2/everything HTTP/1.1\r\nHost: t\r\n\r\n", 404, "not_found_error", nullptr},
      {"wrong method", "GET /v1/completions HTTP/1.1\r\nHost: t\r\n\r\n", 405, ir, nullptr},
      {"chunked request body",
       "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, ir, nullptr},
      {"oversized head", "GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(20000, 'b') + "\r\n\r\n", 431, ir,
       nullptr},
      {"garbage request line", "HELLO\r\n\r\n", 400, ir, nullptr},
      {"unsupported HTTP version", "GET /health HTTP/3.0\r\n\r\n", 505, "server_error", nullptr},
  };
}

void expect_error(const ClientResponse& r, const ErrorCase& c) {
  EXPECT_EQ(r.status, c.status) << c.what << ": " << r.body;
  json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << c.what << ": " << r.body;
  const json& e = j["error"];
  EXPECT_EQ(e["type"], c.type) << c.what;
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << c.what;
  if (c.param)
    EXPECT_EQ(e["param"], c.param) << c.what << ": " << e["message"];
  else
    EXPECT_TRUE(e["param"].is_null()) << c.what << ": " << e["param"];
  EXPECT_TRUE(e.contains("code")) << c.what;
}

TEST_F(ServeTest, ErrorTableOverRawHttpWithoutDisturbingAStream) {
  FakeEngineOptions eo;
  eo.tick_s = 0.002;
  start(ServeOptions(), eo);
  // A stream that runs through the whole barrage and must come out intact.
  auto streamer = client();
  json body = {{"model", "fake"}, {"prompt", "steady"}, {"max_tokens", 120}, {"seed", 11}, {"stream", true}};
  ASSERT_EQ(streamer->start_stream("POST", "/v1/completions", body.dump()).status, 200);
  for (const ErrorCase& c : error_cases()) expect_error(raw(c.request), c);
  Stream s = read_stream(*streamer);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text(), expected_text("steady", 120, 1.0, 11));
  EXPECT_EQ(engine_->aborts(), 0);
  // Each refusal was counted.
  std::string m = get("/metrics").body;
  EXPECT_NE(m.find("loom_requests_total{endpoint=\"/v1/completions\",status=\"400\"}"), std::string::npos);
  EXPECT_NE(m.find("loom_requests_total{endpoint=\"other\",status=\"413\"} 1"), std::string::npos);
}

TEST_F(ServeTest, ApiKeyIsRequiredOnV1Routes) {
  ServeOptions opt;
  opt.api_key = "s3cret";
  start(opt, FakeEngineOptions());
  std::string body = R"({"model": "fake", "prompt": "x", "max_tokens": 2})";
  ErrorCase missing{"missing key", raw_post("/v1/completions", body), 401, "authentication_error", nullptr};
  ErrorCase wrong{"wrong key", raw_post("/v1/completions", body, "Authorization: Bearer nope\r\n"), 401,
                  "authentication_error", nullptr};
  expect_error(raw(missing.request), missing);
  expect_error(raw(wrong.request), wrong);
  ClientResponse models = get("/v1/models");
  EXPECT_EQ(models.status, 401);
  EXPECT_EQ(*models.header("www-authenticate"), "Bearer");
  EXPECT_EQ(raw(raw_post("/v1/completions", body, "Authorization: Bearer s3cret\r\n")).status, 200);
  EXPECT_EQ(get("/v1/models", {{"Authorization", "bearer s3cret"}}).status, 200);
  EXPECT_EQ(get("/health").status, 200);  // probes need no key
  EXPECT_EQ(get("/metrics").status, 200);
}

TEST_F(ServeTest, FullQueueAnswers429AndRecovers) {
  ServeOptions opt;
  opt.max_queue = 1;
  FakeEngineOptions eo;
  eo.max_running = 1;
  start(opt, eo);
  engine_->set_paused(true);
  std::string body = R"({"model": "fake", "prompt": "x", "max_tokens": 3, "temperature": 0})";
  auto a = client(), b = client();
  a->send_raw(raw_post("/v1/completions", body));
  b->send_raw(raw_post("/v1/completions", body));
  ASSERT_TRUE(eventually([&] { return engine_->submitted() == 2; }));
  ErrorCase full{"queue full", raw_post("/v1/completions", body), 429, "rate_limit_error", nullptr};
  expect_error(raw(full.request), full);
  EXPECT_EQ(engine_->submitted(), 2);
  engine_->set_paused(false);
  EXPECT_EQ(json::parse(a->read_response().body)["choices"][0]["text"], "xxx");
  EXPECT_EQ(b->read_response().status, 200);
  EXPECT_EQ(raw(full.request).status, 200);
}

TEST_F(ServeTest, SlowClientsGet408AndIdleOnesAreClosed) {
  ServeOptions opt;
  opt.http.read_timeout_s = 0.2;
  opt.http.idle_timeout_s = 0.3;
  start(opt, FakeEngineOptions());
  auto slow = client();
  slow->send_raw("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Le");  // and then nothing
  ErrorCase late{"head too slow", "", 408, "invalid_request_error", nullptr};
  expect_error(slow->read_response(), late);
  auto slow_body = client();
  slow_body->send_raw("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 50\r\n\r\n{\"model\"");
  expect_error(slow_body->read_response(), late);
  // The idle connection is closed by the server, and not before its 0.3 s: waited for on the
  // socket (the 30 s deadline only ends a server that never closes it), timed from before the
  // request, so a slow scheduler lengthens the wait but cannot fail the test.
  auto idle = client();
  Stopwatch since_request;
  EXPECT_EQ(idle->request("GET", "/health").status, 200);
  while (!idle->drop_if_stale() && since_request.seconds() < 30)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(idle->connected()) << "the server kept an idle connection open for 30 s";
  EXPECT_GE(since_request.seconds(), 0.3) << "closed before the idle timeout";
  EXPECT_EQ(server_->in_flight(), 0);
}

TEST_F(ServeTest, ExpectContinueIsAnswered) {
  start();
  auto c = client();
  std::string body = R"({"model": "fake", "prompt": "ok", "max_tokens": 2, "temperature": 0})";
  c->send_raw("POST /v1/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\n\r\n");
  // The interim response arrives before we send the body (a server that never sends it
  // fails here, at the client's timeout).
  EXPECT_EQ(c->read_interim(), 100);
  c->send_raw(body);
  ClientResponse r = c->read_response();
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], "ok");
}

}  // namespace
}  // namespace loom::serve::testing
