// The OpenAI-compatible server: routes (/v1/completions, /v1/chat/completions, /v1/models,
// /health, /metrics), API-key check, admission bound (429), Prometheus metrics, and the
// shutdown sequence. It drives any Engine (engine_api.h) and never owns the model.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "loom/serve/engine_api.h"
#include "loom/serve/http_server.h"
#include "loom/serve/metrics.h"
#include "loom/serve/openai_request.h"

namespace loom::serve {

struct ServeOptions {
  HttpServerOptions http;
  std::string api_key;            // empty: no authentication
  int64_t max_queue = 256;        // requests allowed to wait beyond the engine's max_running()
  std::string served_model_name = "loom";
  double poll_interval_s = 0.02;  // how often a waiting request checks for a gone client
  uint64_t seed = 0;              // seeds requests that bring none (request k gets seed + k)
};

class ApiServer {
 public:
  explicit ApiServer(ServeOptions opt);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Starts listening; /health answers 503 and generation 503 until set_engine().
  void start();
  // The model is loaded: from now on requests go to `engine`, which must outlive stop().
  void set_engine(Engine* engine);
  bool ready() const { return engine_.load() != nullptr; }
  int port() const { return http_.port(); }

  // Refuses new work (503), lets running requests finish for up to grace_s, aborts the
  // rest (their clients get an error), then closes every connection. Every connection
  // accepted, or waiting in the listen backlog, gets a complete answer (HttpServer::stop).
  // Idempotent.
  void stop(double grace_s);

  MetricsRegistry& metrics() { return metrics_; }
  int64_t in_flight() const { return in_flight_.load(); }
  const ServeOptions& options() const { return opt_; }

 private:
  void handle(HttpExchange& ex);
  void dispatch(HttpExchange& ex, std::string* endpoint);
  void handle_generation(HttpExchange& ex, ApiKind kind);
  bool authorized(const HttpRequest& req) const;
  HttpResponse models_response(const std::string* only) const;
  std::string render_metrics();
  // Admission: true if a slot was taken (release with finish_request()).
  bool admit(Engine& engine);
  bool register_request(uint64_t id);
  void finish_request(uint64_t id);

  ServeOptions opt_;
  MetricsRegistry metrics_;
  HttpServer http_;
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<uint64_t> next_seq_{0};
  int64_t created_ = 0;  // unix time of start, reported as the model's `created`
  std::mutex active_mu_;
  std::set<uint64_t> active_;  // engine ids of requests being served
  bool aborting_all_ = false;  // under active_mu_
  bool stopped_ = false;
};

}  // namespace loom::serve
