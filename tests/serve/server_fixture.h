// In-process server on an ephemeral loopback port over the fake engine, plus helpers to talk
// raw HTTP to it. Shared by the server tests.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/serve/api_server.h"
#include "loom/serve/client/http_client.h"
#include "loom/serve/text_stream.h"
#include "serve/fake_engine.h"

namespace loom::serve::testing {

using nlohmann::json;

// Polls `cond` for up to `seconds`.
template <class F>
bool eventually(F cond, double seconds = 5) {
  double end = now_seconds() + seconds;
  while (now_seconds() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

class ServeTest : public ::testing::Test {
 protected:
  void TearDown() override { shutdown(); }

  void start() { start(ServeOptions(), FakeEngineOptions()); }
  void start(const ServeOptions& options, const FakeEngineOptions& eopt, bool with_engine = true) {
    ServeOptions opt = options;
    opt.http.host = "127.0.0.1";
    opt.http.port = 0;
    opt.http.access_log = false;  // its lines are tested in http_server_test and serve_cli_test
    opt.served_model_name = "fake";
    engine_ = std::make_unique<FakeEngine>(eopt);
    server_ = std::make_unique<ApiServer>(opt);
    server_->start();
    if (with_engine) server_->set_engine(engine_.get());
  }
  void shutdown() {
    if (server_) server_->stop(1.0);
    server_.reset();
    engine_.reset();
  }

  std::unique_ptr<HttpClient> client(double timeout_s = 10) {
    return std::make_unique<HttpClient>("127.0.0.1", server_->port(), timeout_s);
  }
  ClientResponse post(const std::string& path, const json& body, const net::HeaderList& h = {}) {
    return client()->request("POST", path, body.dump(), h);
  }
  ClientResponse get(const std::string& path, const net::HeaderList& h = {}) {
    return client()->request("GET", path, "", h);
  }
  ClientResponse raw(const std::string& bytes) {
    auto c = client();
    c->send_raw(bytes);
    return c->read_response();
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<ApiServer> server_;
};

// The text the fake engine's tokens render to for this prompt and these settings.
inline std::string expected_text(const std::string& prompt, int64_t max_tokens, double temperature, uint64_t seed,
                                 const std::vector<std::string>& stops = {}) {
  GenerationRequest g;
  g.prompt = ByteTextTokenizer().encode(prompt);
  g.sampling.max_tokens = max_tokens;
  g.sampling.temperature = temperature;
  g.sampling.seed = seed;
  return render_completion(ByteTextTokenizer(), FakeEngine::reference(g), stops);
}

// A POST request as bytes, with a correct Content-Length.
inline std::string raw_post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\n" + extra + "Content-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// Reads a whole SSE stream: the JSON chunks (in order) and whether [DONE] ended it.
struct Stream {
  std::vector<json> chunks;
  bool done = false;
  std::string text() const {
    std::string s;
    for (const auto& c : chunks)
      if (c.contains("choices") && !c["choices"].empty()) {
        const json& ch = c["choices"][0];
        if (ch.contains("text")) s += ch["text"].get<std::string>();
        if (ch.contains("delta") && ch["delta"].contains("content")) s += ch["delta"]["content"].get<std::string>();
      }
    return s;
  }
};
inline Stream read_stream(HttpClient& c) {
  Stream s;
  while (auto ev = c.next_event()) {
    EXPECT_FALSE(s.done) << "data after [DONE]";
    if (*ev == "[DONE]")
      s.done = true;
    else
      s.chunks.push_back(json::parse(*ev));
  }
  return s;
}

}  // namespace loom::serve::testing
