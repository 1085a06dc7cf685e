// The OpenAI-compatible server: routes (/v1/completions, /v1/chat/completions, /v1/models,
// /health, /metrics, and any extra routes its user adds), API-key check, admission bound
// (429), Prometheus metrics, and the shutdown sequence. It drives any Engine (engine_api.h),
// which may be replaced between requests (a cascade edge's model update); as an edge it asks
// an EdgeHook whether to answer or forward (edge_hook.h). It never loads a model.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "loom/net/http_server.h"
#include "loom/net/metrics.h"
#include "loom/serve/edge_hook.h"
#include "loom/serve/engine_api.h"
#include "loom/serve/openai_request.h"

namespace loom::serve {

struct ServeOptions {
  net::HttpServerOptions http;
  std::string api_key;      // empty: no authentication
  int64_t max_queue = 256;  // requests allowed to wait beyond the engine's max_running()
  std::string served_model_name = "loom";
  double poll_interval_s = 0.02;  // how often a waiting request checks for a gone client
  uint64_t seed = 0;              // seeds requests that bring none (request k gets seed + k)
  // "" for a plain server, "center" or "edge" in a cascade: named, with the model's version,
  // in every answer's system_fingerprint and X-Loom-Answered-By header.
  std::string role;
  // Routes beyond the OpenAI ones (a cascade center's manifest and files): a request whose
  // path starts with `prefix` goes to `handle` (after the API-key check for /v1/ paths).
  struct Route {
    std::string prefix, method;
    std::function<void(net::HttpExchange&)> handle;
  };
  std::vector<Route> routes;
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
  // The same, shared: a request keeps the engine it started on, so a replaced engine lives
  // until its last request has finished (then the server drops it).
  void set_engine(std::shared_ptr<Engine> engine);
  std::shared_ptr<Engine> engine() const;
  // Makes this server a cascade edge (before start()): `edge` decides whether the edge answers
  // and forwards what it does not; it must outlive stop().
  void set_edge(EdgeHook* edge) { edge_ = edge; }
  // One more route like ServeOptions::routes (before start()).
  void add_route(ServeOptions::Route route) { opt_.routes.push_back(std::move(route)); }
  bool ready() const { return engine() != nullptr; }
  int port() const { return http_.port(); }

  // Refuses new work (503), lets running requests finish for up to grace_s, aborts the
  // rest (their clients get an error), then closes every connection. Every connection
  // accepted, or waiting in the listen backlog, gets a complete answer (HttpServer::stop).
  // Idempotent.
  void stop(double grace_s);

  net::MetricsRegistry& metrics() { return metrics_; }
  int64_t in_flight() const { return in_flight_.load(); }
  const ServeOptions& options() const { return opt_; }

 private:
  void handle(net::HttpExchange& ex);
  void dispatch(net::HttpExchange& ex, std::string* endpoint);
  void handle_generation(net::HttpExchange& ex, ApiKind kind);
  bool authorized(const net::HttpRequest& req) const;
  net::HttpResponse models_response(const std::string* only) const;
  std::string render_metrics();
  // Admission: true if a slot was taken (release with finish_request()).
  bool admit(Engine& engine);
  bool register_request(Engine* engine, uint64_t id);
  void finish_request(Engine* engine, uint64_t id);

  ServeOptions opt_;
  EdgeHook* edge_ = nullptr;
  net::MetricsRegistry metrics_;
  net::HttpServer http_;
  mutable std::mutex engine_mu_;
  std::shared_ptr<Engine> engine_;  // under engine_mu_
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<uint64_t> next_seq_{0};
  int64_t created_ = 0;  // unix time of start, reported as the model's `created`
  std::mutex active_mu_;
  std::set<std::pair<Engine*, uint64_t>> active_;  // (engine, id) of requests being served
  bool aborting_all_ = false;                      // under active_mu_
  bool stopped_ = false;
};

}  // namespace loom::serve
