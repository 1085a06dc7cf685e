// One generation request from its submission to the engine to its last byte: the engine's
// events pass through the text stream (UTF-8, stop strings) to a response writer; an edge's
// first window is held back until the cascade has decided who answers; the engine request is
// aborted when the client goes away, a stop string appears or the server shuts down; the
// request's latencies and outcome go to the metrics.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/net/metrics.h"
#include "loom/serve/edge_hook.h"
#include "loom/serve/engine_api.h"
#include "loom/serve/response_writer.h"
#include "loom/serve/text_stream.h"

namespace loom::serve {

// Events from the engine's thread to the request's thread.
class EventChannel {
 public:
  void push(const TokenEvent& ev);
  // The events that arrived, after waiting up to `seconds` for the first.
  std::vector<TokenEvent> wait(double seconds);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenEvent> events_;
};

struct StreamSetup {
  uint64_t engine_id = 0;         // the request's id in the engine
  std::string log_id;             // the response's id, for the access and error logs
  double t_arrival = 0;           // now_seconds() when the request arrived
  int64_t n_prompt = 0;           // prompt tokens
  double poll_interval_s = 0.02;  // how often a waiting request checks for a gone client
  bool return_token_ids = false;  // the answer lists the tokens generated
  bool stream = false;            // server-sent events (else one JSON body)
  std::string edge_version;       // the engine's model version (an edge reports it)
  net::HeaderList headers;        // X-Loom-* identity of the answer
  EdgeHook* edge = nullptr;       // set on a cascade edge
};

class GenerationStream {
 public:
  GenerationStream(net::HttpExchange& ex, Engine& engine, std::shared_ptr<EventChannel> events, TextStream& text,
                   ResponseWriter& writer, net::MetricsRegistry& metrics, StreamSetup setup);
  // Relays the request to its end and answers it (or leaves a gone client).
  void run();

 private:
  void begin();  // the response's head, once who answers is known
  void emit(const std::string& delta);
  void take(const TokenEvent& ev);
  // The edge's window is complete: true when the request was answered elsewhere (or refused).
  bool decide();
  void abort_engine();
  void conclude();  // metrics, log line and the answer's end

  net::HttpExchange& ex_;
  Engine& engine_;
  std::shared_ptr<EventChannel> events_;
  TextStream& text_;
  ResponseWriter& writer_;
  net::MetricsRegistry& metrics_;
  StreamSetup s_;
  net::Histogram& ttft_;
  net::Histogram& itl_;

  bool deciding_ = false;             // an edge holds its first window back
  std::string held_;                  // the window's text meanwhile
  std::vector<double> window_probs_;  // and its tokens' probabilities
  bool client_gone_ = false;
  bool stop_hit_ = false;
  double t_abort_ = 0;  // when the engine request was aborted (0: not)
  double t_last_ = 0;
  int64_t n_generated_ = 0;
  std::vector<int32_t> token_ids_;  // return_token_ids
  FinishReason engine_finish_ = FinishReason::none;
  std::string engine_error_;  // engine_finish_ == error: why
};

}  // namespace loom::serve
