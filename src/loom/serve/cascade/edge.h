// The edge of an edge/center cascade (docs/CASCADE.md): the EdgeHook the API server consults
// (forward a request to the center, keeping connections to it alive), and a poller that reads
// the center's manifest, measures the link, chooses int8 or int4 weights, downloads a new
// small model in the background, verifies every hash, and installs it between requests.
#pragma once
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "loom/net/metrics.h"
#include "loom/serve/api_server.h"
#include "loom/serve/cascade/version.h"
#include "loom/serve/client/http_client.h"
#include "loom/serve/edge_hook.h"
#include "loom/serve/engine_api.h"

namespace loom::serve::cascade {

struct EdgeOptions {
  std::string center_url;              // http://host:port of the center
  double threshold = 0.5;              // confidence in [0, 1] at or above which the edge answers
  int64_t window = 16;                 // tokens the confidence is measured over
  bool local_when_center_down = true;  // false: 503 when the edge would forward but cannot
  double poll_interval_s = 10;         // manifest polls
  std::string cache_dir;               // downloaded models, one directory per version hash
  std::string api_key;                 // sent to the center when the client sent none
  double timeout_s = 300;              // a forward's or a download's socket timeout
  // Adaptive weights: "auto" picks int4 when the link is slower than int4_below_mbps, its
  // round trip longer than int4_above_rtt_ms, or the int8 model larger than half the memory
  // budget; "int8"/"int4" fix the choice.
  std::string quant = "auto";
  double int4_below_mbps = 50;
  double int4_above_rtt_ms = 200;
  int64_t memory_budget_bytes = 0;  // 0: the machine's MemAvailable
  // Throws "[serve] --<option> ..." naming a bad value.
  void validate() const;
};

struct LinkEstimate {
  double rtt_s = std::numeric_limits<double>::quiet_NaN();          // manifest round trips
  double bandwidth_bps = std::numeric_limits<double>::quiet_NaN();  // downloads and the probe
};

struct QuantChoice {
  std::string variant;  // "int8" or "int4"; "" when the manifest offers neither
  std::string why;      // for the log: the measurement that decided it
};
// The rule above, on the manifest's "edge_models" object.
QuantChoice choose_quant(const EdgeOptions& opt, const LinkEstimate& link, int64_t memory_budget_bytes,
                         const nlohmann::json& edge_models);

// Builds a servable engine from a checkpoint directory (the edge's tool supplies it).
using EngineLoader = std::function<std::shared_ptr<Engine>(const std::string& dir, const ModelVersion& version)>;
using EngineInstaller = std::function<void(std::shared_ptr<Engine>)>;

class Edge final : public EdgeHook {
 public:
  // `local`: the version of the model the edge starts with. `metrics` must outlive the edge.
  Edge(EdgeOptions opt, std::string tokenizer_sha256, ModelVersion local, EngineLoader load, EngineInstaller install,
       net::MetricsRegistry* metrics);
  ~Edge() override;
  void start();      // polls now, then every poll_interval_s, on its own thread
  void stop();       // idempotent; waits for a download in flight to end
  void poll_once();  // one poll (and update, when there is one), on the caller's thread

  // GET /v1/cascade/status: the edge's model version and variant, the center's, the link
  // estimate and the last weight choice (for operators and `loom bench cascade`).
  nlohmann::json status() const;
  ServeOptions::Route status_route();

  ModelVersion current() const;
  LinkEstimate link() const;
  bool center_usable() const;

  // A request naming `model` goes to the center when the center serves it.
  bool center_serves(const std::string& model) const;
  // The center's version as last seen (for the metrics of requests the edge answers).
  std::string center_version() const;

  // EdgeHook (edge_decision.cpp)
  int64_t window_tokens() const override { return opt_.window; }
  bool route_model(net::HttpExchange& ex, const std::string& model, const std::string& edge_version) override;
  Verdict decide(net::HttpExchange& ex, std::span<const double> probs, bool may_forward,
                 const std::string& edge_version, const std::function<void()>& stop_local,
                 net::HeaderList* headers) override;

 private:
  enum class Forwarded { done, unreachable };
  struct ForwardResult {
    Forwarded outcome = Forwarded::unreachable;
    std::string why;             // unreachable: what failed, for the log and a 503
    std::string center_version;  // done: the version that answered (its X-Loom-Model-Version)
  };
  // Sends ex's request to the center and relays the center's answer on ex, adding `headers`.
  // `taken` runs once the center has the request (the edge then stops its own generation);
  // `answering` just before the center's answer (or a 502 for its failure) goes out on ex, with
  // the version that answered ("" for a 502). unreachable: nothing was written on ex.
  ForwardResult forward(net::HttpExchange& ex, const net::HeaderList& headers, const std::function<void()>& taken,
                        const std::function<void(const std::string& center_version)>& answering);
  // forward() for a reason (`why`: "model" or "confidence"), counted before the client sees
  // the answer and noted in the access log; false when the center could not take it (`failure` says why; nothing was
  // written).
  bool forward_to_center(net::HttpExchange& ex, const std::string& why, const std::string& edge_version,
                         double confidence, const std::function<void()>& taken, std::string* failure);
  void count_answer(const std::string& answered_by, const std::string& edge_version, const std::string& center_version,
                    double confidence);
  void loop();
  void update(const nlohmann::json& target, const std::string& variant);
  void refuse(const std::string& hash, const std::string& id, const std::string& why);
  std::unique_ptr<HttpClient> take_client();
  void keep_client(std::unique_ptr<HttpClient> c);
  net::HeaderList auth(const net::HttpRequest* req) const;
  void note_bandwidth(double bytes, double seconds);

  const EdgeOptions opt_;
  const Url center_;
  const std::string tokenizer_sha256_;
  EngineLoader load_;
  EngineInstaller install_;
  net::MetricsRegistry* metrics_;

  mutable std::mutex mu_;
  ModelVersion current_;
  std::string current_variant_;
  LinkEstimate link_;
  std::string center_version_, center_model_;
  bool center_up_ = false, tokenizer_mismatch_ = false;
  std::string last_choice_, last_why_;
  bool polled_ = false;            // a manifest has been read at least once
  std::set<std::string> refused_;  // version hashes that failed verification or loading

  std::mutex pool_mu_;
  std::vector<std::unique_ptr<HttpClient>> pool_;  // idle keep-alive connections to the center
  std::unique_ptr<HttpClient> poll_client_;        // the poller's own (its thread only)

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom::serve::cascade
