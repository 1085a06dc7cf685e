// Routing, authentication, models/health/metrics endpoints and shutdown of the API server.
// The generation endpoints live in generation.cpp.
#include "loom/serve/api_server.h"

#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/timer.h"

namespace loom::serve {

using nlohmann::json;

ApiServer::ApiServer(ServeOptions opt)
    : opt_(std::move(opt)),
      http_(
          opt_.http, [this](net::HttpExchange& ex) { handle(ex); },
          [this](int status, const std::string& message) {
            metrics_
                .counter("loom_requests_total", "HTTP requests by endpoint and status",
                         {{"endpoint", "other"}, {"status", std::to_string(status)}})
                .inc();
            net::HttpResponse r = error_response(error_for_status(status, message));
            return r;
          }) {
  LOOM_CHECK(opt_.max_queue >= 0, "serve", "--max-queue must be >= 0, got ", opt_.max_queue);
  LOOM_CHECK(!opt_.served_model_name.empty(), "serve", "--served-model-name must not be empty");
}

ApiServer::~ApiServer() { stop(0); }

void ApiServer::start() {
  created_ = int64_t(std::time(nullptr));
  http_.start();
}

void ApiServer::set_engine(Engine* engine) {
  set_engine(std::shared_ptr<Engine>(engine, [](Engine*) {}));
}

void ApiServer::set_engine(std::shared_ptr<Engine> engine) {
  std::lock_guard<std::mutex> lock(engine_mu_);
  engine_ = std::move(engine);
}

std::shared_ptr<Engine> ApiServer::engine() const {
  std::lock_guard<std::mutex> lock(engine_mu_);
  return engine_;
}

bool ApiServer::authorized(const net::HttpRequest& req) const {
  if (opt_.api_key.empty()) return true;
  const std::string* h = req.header("authorization");
  if (!h || h->size() < 7 || net::to_lower(h->substr(0, 7)) != "bearer ") return false;
  std::string_view given = std::string_view(*h).substr(7);
  const std::string& want = opt_.api_key;
  // Compare in time independent of where the first difference is.
  unsigned diff = unsigned(given.size() != want.size());
  for (size_t i = 0; i < want.size(); ++i)
    diff |= unsigned(uint8_t(i < given.size() ? given[i] : 0) ^ uint8_t(want[i]));
  return diff == 0;
}

void ApiServer::handle(net::HttpExchange& ex) {
  // Counted before the response's last bytes leave, so that a client's next request (e.g. for
  // /metrics) sees it; finish() covers an exchange that ended without them (client gone).
  std::string endpoint = "other";
  ex.on_finish([&](int status) {
    metrics_
        .counter("loom_requests_total", "HTTP requests by endpoint and status",
                 {{"endpoint", endpoint}, {"status", std::to_string(status)}})
        .inc();
  });
  dispatch(ex, &endpoint);
  ex.finish();
}

void ApiServer::dispatch(net::HttpExchange& ex, std::string* endpoint) {
  const net::HttpRequest& req = ex.request();
  const std::string& path = req.path;
  struct Route {
    const char* path;
    const char* method;
  };
  static constexpr Route routes[] = {{"/health", "GET"},
                                     {"/metrics", "GET"},
                                     {"/v1/models", "GET"},
                                     {"/v1/completions", "POST"},
                                     {"/v1/chat/completions", "POST"}};
  const Route* route = nullptr;
  for (const Route& r : routes)
    if (path == r.path) route = &r;
  bool model_path = path.rfind("/v1/models/", 0) == 0 && path.size() > 11;
  const ServeOptions::Route* extra = nullptr;
  for (const ServeOptions::Route& r : opt_.routes)
    if (!route && path.rfind(r.prefix, 0) == 0) extra = &r;
  if (!route && !model_path && !extra) {
    ex.respond(error_response(error_for_status(404, str_cat("no route for ", req.method, " ", path))));
    return;
  }
  *endpoint = extra ? extra->prefix : route ? route->path : "/v1/models/{id}";
  const char* method = extra ? extra->method.c_str() : route ? route->method : "GET";
  if (req.method != method) {
    net::HttpResponse r =
        error_response(error_for_status(405, str_cat(path, " accepts ", method, ", not ", req.method)));
    r.headers.emplace_back("Allow", method);
    ex.respond(r);
    return;
  }
  if (path.rfind("/v1/", 0) == 0 && !authorized(req)) {
    bool missing = req.header("authorization") == nullptr;
    net::HttpResponse r = error_response(
        error_for_status(401, missing ? "missing API key: send 'Authorization: Bearer <key>'" : "incorrect API key"));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    ex.respond(r);
    return;
  }
  if (extra) return extra->handle(ex);
  const std::shared_ptr<Engine> engine = this->engine();
  if (path == "/health") {
    net::HttpResponse r;
    r.status = engine ? 200 : 503;
    r.body = engine ? R"({"status":"ok"})" : R"({"status":"loading"})";
    ex.respond(r);
  } else if (path == "/metrics") {
    net::HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = render_metrics();
    ex.respond(r);
  } else if (!engine) {
    ex.respond(error_response(error_for_status(503, "the model is still loading; retry when GET /health returns 200")));
  } else if (path == "/v1/models") {
    ex.respond(models_response(nullptr));
  } else if (model_path) {
    std::string id = path.substr(11);
    ex.respond(models_response(&id));
  } else {
    handle_generation(ex, path == "/v1/completions" ? ApiKind::completion : ApiKind::chat);
  }
}

net::HttpResponse ApiServer::models_response(const std::string* only) const {
  const std::shared_ptr<Engine> engine = this->engine();
  json model = {{"id", opt_.served_model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "loom"},
                {"max_model_len", engine->context_length()}};
  if (only && *only != opt_.served_model_name)
    return error_response(error_for_status(404, str_cat("the model '", *only, "' does not exist")));
  net::HttpResponse r;
  r.body = only ? model.dump() : json{{"object", "list"}, {"data", json::array({model})}}.dump();
  return r;
}

std::string ApiServer::render_metrics() {
  if (const std::shared_ptr<Engine> engine = this->engine()) {
    EngineStats s = engine->stats();
    metrics_.gauge("loom_num_requests_running", "requests the engine is stepping").set(double(s.running));
    metrics_.gauge("loom_num_requests_waiting", "requests queued in the engine").set(double(s.waiting));
    metrics_.gauge("loom_kv_cache_usage_ratio", "fraction of KV-cache blocks in use (0 to 1)")
        .set(s.kv_blocks_total > 0 ? double(s.kv_blocks_used) / double(s.kv_blocks_total) : 0.0);
    metrics_.gauge("loom_kv_cache_blocks_used", "KV-cache blocks in use").set(double(s.kv_blocks_used));
    metrics_.gauge("loom_kv_cache_blocks_total", "KV-cache blocks in the pool").set(double(s.kv_blocks_total));
    metrics_.gauge("loom_spec_decode_proposed_tokens", "speculative decoding: tokens proposed and scored so far")
        .set(double(s.spec_proposed));
    metrics_
        .gauge("loom_spec_decode_accepted_tokens", "speculative decoding: proposed tokens the model accepted so far")
        .set(double(s.spec_accepted));
  }
  metrics_.gauge("loom_num_requests_in_flight", "generation requests admitted by the server")
      .set(double(in_flight_.load()));
  metrics_.gauge("loom_http_connections_open", "open HTTP connections").set(double(http_.open_connections()));
  return metrics_.render();
}

bool ApiServer::admit(Engine& engine) {
  int64_t limit = engine.max_running() + opt_.max_queue;
  if (in_flight_.fetch_add(1) + 1 > limit) {
    --in_flight_;
    return false;
  }
  return true;
}

bool ApiServer::register_request(Engine* engine, uint64_t id) {
  std::lock_guard<std::mutex> lock(active_mu_);
  if (aborting_all_) return false;
  active_.insert({engine, id});
  return true;
}

void ApiServer::finish_request(Engine* engine, uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    active_.erase({engine, id});
  }
  --in_flight_;
}

void ApiServer::stop(double grace_s) {
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  draining_ = true;
  http_.stop_accepting();
  double deadline = now_seconds() + grace_s;
  while (in_flight_.load() > 0 && now_seconds() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    aborting_all_ = true;
    // Every engine in active_ is alive: its requests hold it (handle_generation).
    for (const auto& [engine, id] : active_) engine->abort(id);
  }
  // Aborted requests end once the engine confirms; bounded so a stuck engine cannot hang exit.
  deadline = now_seconds() + 10;
  while (in_flight_.load() > 0 && now_seconds() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http_.stop();
}

}  // namespace loom::serve
