// The OpenAI server over the fake engine: completions, chat, streaming, keep-alive,
// disconnects (the engine request is aborted and its blocks freed), metrics, shutdown.
#include "serve/server_fixture.h"

namespace loom::serve::testing {
namespace {

TEST_F(ServeTest, HealthIs503UntilTheEngineIsSet) {
  start(ServeOptions(), FakeEngineOptions(), /*with_engine=*/false);
  EXPECT_EQ(get("/health").status, 503);
  ClientResponse r = post("/v1/completions", {{"model", "fake"}, {"prompt", "x"}});
  EXPECT_EQ(r.status, 503);
  server_->set_engine(engine_.get());
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(ServeTest, ModelsList) {
  start();
  ClientResponse r = get("/v1/models");
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "fake");
  EXPECT_EQ(j["data"][0]["max_model_len"], 256);
  EXPECT_EQ(json::parse(get("/v1/models/fake").body)["id"], "fake");
  EXPECT_EQ(get("/v1/models/other").status, 404);
}

TEST_F(ServeTest, CompletionReturnsTheEngineTokensAndUsage) {
  start();
  ClientResponse r =
      post("/v1/completions", {{"model", "fake"}, {"prompt", "hello"}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "fake");
  EXPECT_EQ(j["choices"][0]["text"], "hellohel");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 5}, {"completion_tokens", 8}, {"total_tokens", 13}}));

  // Sampling with a seed: the same seed gives the same text, another seed another text.
  json body = {{"model", "fake"}, {"prompt", "abc"}, {"max_tokens", 12}, {"seed", 7}};
  std::string a = json::parse(post("/v1/completions", body).body)["choices"][0]["text"];
  EXPECT_EQ(a, expected_text("abc", 12, 1.0, 7));
  EXPECT_EQ(json::parse(post("/v1/completions", body).body)["choices"][0]["text"], a);
  body["seed"] = 8;
  EXPECT_NE(json::parse(post("/v1/completions", body).body)["choices"][0]["text"], a);
}

// return_token_ids (an extension): the choice carries the engine's tokens, in a plain answer
// and in a stream's last chunk; without it there is no such field.
TEST_F(ServeTest, ReturnTokenIdsGivesTheEngineTokens) {
  start();
  json body = {
      {"model", "fake"}, {"prompt", "hello"}, {"max_tokens", 8}, {"temperature", 0}, {"return_token_ids", true}};
  const std::vector<int32_t> want = {'h', 'e', 'l', 'l', 'o', 'h', 'e', 'l'};
  json j = json::parse(post("/v1/completions", body).body);
  EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want);
  body["stream"] = true;
  auto c = client();
  c->start_stream("POST", "/v1/completions", body.dump());
  json last;
  while (auto ev = c->next_event())
    if (*ev != "[DONE]") last = json::parse(*ev);
  EXPECT_EQ(last["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want);
  body.erase("return_token_ids");
  body["stream"] = false;
  EXPECT_FALSE(json::parse(post("/v1/completions", body).body)["choices"][0].contains("token_ids"));
  body["return_token_ids"] = "yes";
  EXPECT_EQ(post("/v1/completions", body).status, 400);
}

TEST_F(ServeTest, StopStringEndsTheRequestAndAbortsTheEngineSide) {
  start();
  ClientResponse r = post(
      "/v1/completions",
      {{"model", "fake"}, {"prompt", "hello world"}, {"max_tokens", 40}, {"temperature", 0}, {"stop", {"wor", "zzz"}}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], "hello ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);  // "hello wor"
  EXPECT_TRUE(eventually([&] { return engine_->stats().running == 0; }));
  EXPECT_EQ(engine_->aborts(), 1);
}

TEST_F(ServeTest, ChatUsesTheTemplate) {
  start();
  json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  ClientResponse r =
      post("/v1/chat/completions", {{"model", "fake"}, {"messages", msgs}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  // temperature 0 echoes the templated prompt, which starts with "<|im_start|>".
  EXPECT_EQ(j["choices"][0]["message"]["content"], "<|im_s");
  EXPECT_EQ(j["usage"]["prompt_tokens"],
            int64_t(std::string("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").size()));
}

TEST_F(ServeTest, StreamingCompletionSendsChunksThenDone) {
  start();
  auto c = client();
  json body = {{"model", "fake"}, {"prompt", "abc"}, {"max_tokens", 10}, {"seed", 3}, {"stream", true}};
  ClientResponse head = c->start_stream("POST", "/v1/completions", body.dump());
  ASSERT_EQ(head.status, 200);
  EXPECT_EQ(*head.header("content-type"), "text/event-stream");
  Stream s = read_stream(*c);
  EXPECT_TRUE(s.done);
  ASSERT_GE(s.chunks.size(), 2u);
  EXPECT_EQ(s.text(), expected_text("abc", 10, 1.0, 3));
  const json& last = s.chunks.back();
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["usage"]["completion_tokens"], 10);
  for (size_t i = 0; i + 1 < s.chunks.size(); ++i) EXPECT_TRUE(s.chunks[i]["choices"][0]["finish_reason"].is_null());
  // The connection is still usable (keep-alive after a chunked stream).
  EXPECT_EQ(c->request("GET", "/health").status, 200);
}

TEST_F(ServeTest, StreamingChatSendsRoleFirstAndUsageOnRequest) {
  start();
  auto c = client();
  json body = {{"model", "fake"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 5},
               {"stream", true},  {"stream_options", {{"include_usage", true}}},        {"temperature", 0}};
  ASSERT_EQ(c->start_stream("POST", "/v1/chat/completions", body.dump()).status, 200);
  Stream s = read_stream(*c);
  ASSERT_TRUE(s.done);
  EXPECT_EQ(s.chunks.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(s.chunks.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(s.text(), "<|im_");
  const json& usage_chunk = s.chunks.back();
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 5);
  EXPECT_EQ(s.chunks[s.chunks.size() - 2]["choices"][0]["finish_reason"], "length");
}

TEST_F(ServeTest, KeepAliveAndPipelinedRequests) {
  start();
  auto c = client();
  std::string one = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  std::string two = raw_post("/v1/completions", R"({"model":"fake","prompt":"ab","max_tokens":3,"temperature":0.0})");
  c->send_raw(one + two + one);
  EXPECT_EQ(c->read_response().status, 200);
  ClientResponse r = c->read_response();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], "aba");
  EXPECT_EQ(c->read_response().status, 200);
  // Connection: close is honoured.
  c->send_raw("GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  ClientResponse last = c->read_response();
  EXPECT_EQ(*last.header("connection"), "close");
  EXPECT_FALSE(c->connected());
}

TEST_F(ServeTest, ClientDisconnectMidStreamAbortsAndFreesBlocks) {
  FakeEngineOptions eo;
  eo.tick_s = 0.005;
  start(ServeOptions(), eo);
  auto c = client();
  json body = {{"model", "fake"}, {"prompt", std::string(40, 'p')}, {"max_tokens", 200}, {"stream", true}};
  ASSERT_EQ(c->start_stream("POST", "/v1/completions", body.dump()).status, 200);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->next_event());
  EXPECT_GT(engine_->stats().kv_blocks_used, 0);
  c->close();
  EXPECT_TRUE(eventually([&] { return engine_->aborts() == 1; }));
  EXPECT_TRUE(eventually([&] {
    EngineStats s = engine_->stats();
    return s.kv_blocks_used == 0 && s.running == 0 && server_->in_flight() == 0;
  }));
  // The server keeps serving.
  EXPECT_EQ(post("/v1/completions", {{"model", "fake"}, {"prompt", "q"}, {"max_tokens", 2}}).status, 200);
}

TEST_F(ServeTest, ClientDisconnectWhileWaitingNonStreamingAborts) {
  start();
  engine_->set_paused(true);
  auto c = client();
  c->send_raw(raw_post("/v1/completions", R"({"model":"fake","prompt":"x","max_tokens":9})"));
  EXPECT_TRUE(eventually([&] { return engine_->submitted() == 1; }));
  c->close();
  EXPECT_TRUE(eventually([&] { return engine_->aborts() == 1 && server_->in_flight() == 0; }));
  EXPECT_TRUE(eventually([&] {
    return get("/metrics").body.find("loom_requests_total{endpoint=\"/v1/completions\",status=\"499\"} 1") !=
           std::string::npos;
  }));
}

TEST_F(ServeTest, Http10ClientsGetACloseDelimitedStream) {
  start();
  auto c = client();
  std::string body = R"({"model":"fake","prompt":"abc","max_tokens":6,"seed":2,"stream":true})";
  c->send_raw("POST /v1/completions HTTP/1.0\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  ClientResponse r = c->read_response();
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("transfer-encoding"), nullptr);
  EXPECT_EQ(r.header("content-length"), nullptr);
  EXPECT_EQ(*r.header("connection"), "close");
  EXPECT_NE(r.body.find("data: [DONE]\n\n"), std::string::npos) << r.body;
  EXPECT_FALSE(c->connected());
}

TEST_F(ServeTest, MetricsCountRequestsTokensAndLatencies) {
  start();
  ASSERT_EQ(post("/v1/completions", {{"model", "fake"}, {"prompt", "abcd"}, {"max_tokens", 5}}).status, 200);
  EXPECT_EQ(get("/nope").status, 404);
  ClientResponse m = get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.header("content-type")->rfind("text/plain; version=0.0.4", 0), 0u);
  const std::string& t = m.body;
  for (const char* line : {"loom_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1\n",
                           "loom_requests_total{endpoint=\"other\",status=\"404\"} 1\n", "loom_prompt_tokens_total 4\n",
                           "loom_generation_tokens_total 5\n", "loom_time_to_first_token_seconds_count 1\n",
                           "loom_inter_token_latency_seconds_count 4\n", "loom_e2e_request_latency_seconds_count 1\n",
                           "loom_num_requests_running 0\n", "loom_num_requests_waiting 0\n",
                           "loom_kv_cache_usage_ratio 0\n", "# TYPE loom_time_to_first_token_seconds histogram\n",
                           "loom_request_finished_total{finish_reason=\"length\"} 1\n"})
    EXPECT_NE(t.find(line), std::string::npos) << line << "\n" << t;
}

TEST_F(ServeTest, ShutdownAbortsInFlightStreamsWithAnErrorEvent) {
  FakeEngineOptions eo;
  eo.tick_s = 0.01;
  start(ServeOptions(), eo);
  auto c = client();
  json body = {{"model", "fake"}, {"prompt", "x"}, {"max_tokens", 250}, {"stream", true}};
  ASSERT_EQ(c->start_stream("POST", "/v1/completions", body.dump()).status, 200);
  ASSERT_TRUE(c->next_event());
  std::jthread stopper([&] { server_->stop(0.05); });
  std::string last;
  while (auto ev = c->next_event()) last = *ev;
  stopper.join();
  EXPECT_NE(last.find("shutting down"), std::string::npos) << last;
  EXPECT_EQ(engine_->aborts(), 1);
  EXPECT_EQ(server_->in_flight(), 0);
  HttpClient after("127.0.0.1", server_->port(), 2);
  EXPECT_THROW(after.request("GET", "/health"), loom::Error);
}

TEST_F(ServeTest, ShutdownLetsShortRequestsFinish) {
  FakeEngineOptions eo;
  eo.tick_s = 0.005;
  start(ServeOptions(), eo);
  auto c = client();
  json body = {{"model", "fake"}, {"prompt", "x"}, {"max_tokens", 20}, {"seed", 1}, {"stream", true}};
  ASSERT_EQ(c->start_stream("POST", "/v1/completions", body.dump()).status, 200);
  ASSERT_TRUE(c->next_event());
  std::jthread stopper([&] { server_->stop(5.0); });
  Stream rest = read_stream(*c);
  stopper.join();
  EXPECT_TRUE(rest.done);
  EXPECT_EQ(engine_->aborts(), 0);
}

}  // namespace
}  // namespace loom::serve::testing
