// The relay loop of one generation request (generation_stream.h) and its outcome: the
// finish reason a client sees, the metrics of the request and the access log's note.
#include "loom/serve/generation_stream.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

#include "loom/core/error.h"
#include "loom/core/timer.h"

namespace loom::serve {

namespace {

const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                         0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
const std::vector<double> kE2eBuckets = {0.01, 0.025, 0.05, 0.1,  0.25, 0.5,  1.0,  2.5,
                                         5.0,  10.0,  15.0, 20.0, 30.0, 40.0, 50.0, 60.0};

// An engine that never confirms an abort must not pin the request's thread forever.
constexpr double kAbortConfirmS = 10;

}  // namespace

void EventChannel::push(const TokenEvent& ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(ev);
  }
  cv_.notify_one();
}

std::vector<TokenEvent> EventChannel::wait(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return !events_.empty(); });
  return std::exchange(events_, {});
}

GenerationStream::GenerationStream(net::HttpExchange& ex, Engine& engine, std::shared_ptr<EventChannel> events,
                                   TextStream& text, ResponseWriter& writer, net::MetricsRegistry& metrics,
                                   StreamSetup setup)
    : ex_(ex),
      engine_(engine),
      events_(std::move(events)),
      text_(text),
      writer_(writer),
      metrics_(metrics),
      s_(std::move(setup)),
      ttft_(
          metrics.histogram("loom_time_to_first_token_seconds", "time from arrival to the first token", kTtftBuckets)),
      itl_(metrics.histogram("loom_inter_token_latency_seconds", "time between consecutive tokens", kItlBuckets)) {}

void GenerationStream::abort_engine() {
  if (t_abort_ > 0) return;
  engine_.abort(s_.engine_id);
  t_abort_ = now_seconds();
}

void GenerationStream::begin() {
  if (client_gone_) return;
  client_gone_ = !writer_.begin(s_.headers);
  if (client_gone_) abort_engine();
}

void GenerationStream::emit(const std::string& delta) {
  if (delta.empty()) return;
  if (deciding_)
    held_ += delta;
  else if (!client_gone_ && !writer_.text(delta))
    client_gone_ = true;
}

void GenerationStream::take(const TokenEvent& ev) {
  if (ev.token >= 0 && !stop_hit_) {
    const double t = now_seconds();
    (n_generated_ == 0 ? ttft_ : itl_).observe(t - (n_generated_ == 0 ? s_.t_arrival : t_last_));
    t_last_ = t;
    ++n_generated_;
    if (s_.return_token_ids) token_ids_.push_back(ev.token);
    if (deciding_ && std::isfinite(ev.prob)) window_probs_.push_back(ev.prob);
    emit(text_.push_token(ev.token));
    if (text_.stopped()) {
      stop_hit_ = true;
      abort_engine();
    }
  }
  if (ev.finish != FinishReason::none) {
    engine_finish_ = ev.finish;
    engine_error_ = ev.error;
  }
}

bool GenerationStream::decide() {
  deciding_ = false;
  const bool may_forward = !client_gone_ && engine_finish_ != FinishReason::abort;
  if (s_.edge->decide(
          ex_, window_probs_, may_forward, s_.edge_version, [this] { abort_engine(); }, &s_.headers) ==
      EdgeHook::Verdict::answered_elsewhere)
    return true;
  begin();
  emit(std::exchange(held_, {}));
  return false;
}

void GenerationStream::run() {
  deciding_ = s_.edge != nullptr;
  if (!deciding_) begin();
  auto& e2e =
      metrics_.histogram("loom_e2e_request_latency_seconds", "time from arrival to the last token", kE2eBuckets);
  while (true) {
    for (const TokenEvent& ev : events_->wait(s_.poll_interval_s)) take(ev);
    const bool window_done =
        deciding_ && (n_generated_ >= s_.edge->window_tokens() || engine_finish_ != FinishReason::none || stop_hit_);
    if (window_done && decide()) {
      e2e.observe(now_seconds() - s_.t_arrival);
      return;
    }
    if (engine_finish_ != FinishReason::none) break;
    if (!client_gone_ && ex_.client_gone()) client_gone_ = true;
    if (client_gone_) abort_engine();
    if (t_abort_ > 0 && now_seconds() - t_abort_ > kAbortConfirmS) break;
  }
  if (deciding_) {  // left the loop undecided (an abort the engine never confirmed)
    deciding_ = false;
    emit(std::exchange(held_, {}));
  }
  metrics_.counter("loom_generation_tokens_total", "tokens generated").inc(double(n_generated_));
  e2e.observe(now_seconds() - s_.t_arrival);
  conclude();
}

void GenerationStream::conclude() {
  // A stop string seen first makes the response complete, whatever the engine said after it.
  const bool failed = !stop_hit_ && engine_finish_ == FinishReason::error;
  const bool aborted =
      !stop_hit_ && !failed && engine_finish_ != FinishReason::stop && engine_finish_ != FinishReason::length;
  const char* finish = stop_hit_ || engine_finish_ == FinishReason::stop ? "stop" : "length";
  const char* outcome = failed ? "error" : aborted ? (client_gone_ ? "client_gone" : "abort") : finish;
  metrics_
      .counter("loom_request_finished_total", "finished generation requests by reason", {{"finish_reason", outcome}})
      .inc();
  if (failed) std::fprintf(stderr, "[serve] %s failed: %s\n", s_.log_id.c_str(), engine_error_.c_str());
  ex_.note(str_cat("id=", s_.log_id, " tokens=", s_.n_prompt, "+", n_generated_, " finish=", outcome));
  if (client_gone_) {
    if (!s_.stream) ex_.abandon();
    return;  // nobody to answer; a stream just ends with the connection
  }
  if (failed) return writer_.fail(error_for_status(500, engine_error_));
  if (aborted)
    return writer_.fail(error_for_status(503, "the request was aborted because the server is shutting down"));
  emit(text_.finish());
  writer_.finish(finish, {s_.n_prompt, n_generated_}, s_.return_token_ids ? &token_ids_ : nullptr);
}

}  // namespace loom::serve
