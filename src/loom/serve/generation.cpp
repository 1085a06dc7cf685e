// POST /v1/completions and /v1/chat/completions: validate, admit, submit to the engine,
// then relay tokens as one JSON response or as server-sent events, aborting the engine
// request when the client goes away, a stop string appears, or the server shuts down.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/serve/api_server.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/text_stream.h"

namespace loom::serve {

using nlohmann::json;

namespace {

const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                         0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
const std::vector<double> kE2eBuckets = {0.01, 0.025, 0.05, 0.1,  0.25, 0.5,  1.0,  2.5,
                                         5.0,  10.0,  15.0, 20.0, 30.0, 40.0, 50.0, 60.0};

// Events from the engine thread to the request's thread.
class EventChannel {
 public:
  void push(const TokenEvent& ev) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(ev);
    }
    cv_.notify_one();
  }
  std::vector<TokenEvent> wait(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return !events_.empty(); });
    return std::exchange(events_, {});
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenEvent> events_;
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace

void ApiServer::count_cascade(const std::string& answered_by, const std::string& edge_version,
                              const std::string& center_version, double confidence) {
  metrics_
      .counter("loom_cascade_requests_total", "cascade requests by who answered and the version pair",
               {{"answered_by", answered_by}, {"edge_version", edge_version}, {"center_version", center_version}})
      .inc();
  if (std::isfinite(confidence))
    metrics_
        .histogram("loom_cascade_confidence", "the edge's confidence in its first window of tokens",
                   {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0})
        .observe(confidence);
}

bool ApiServer::forward_to_center(HttpExchange& ex, const std::string& why, const std::string& edge_version,
                                  double confidence, const std::function<void()>& taken, std::string* failure) {
  HeaderList headers = {{"X-Loom-Forwarded-Because", why}};
  if (!edge_version.empty()) headers.emplace_back("X-Loom-Edge-Version", edge_version);
  if (std::isfinite(confidence)) headers.emplace_back("X-Loom-Confidence", str_cat(confidence));
  EdgeHook::ForwardResult r = edge_->forward(ex, headers, taken);
  if (r.outcome == EdgeHook::Forwarded::unreachable) {
    std::fprintf(stderr, "[serve] cascade: the center cannot take a request: %s\n", r.why.c_str());
    *failure = r.why;
    return false;
  }
  count_cascade("center", edge_version, r.center_version, confidence);
  ex.note(str_cat("forwarded=", why));
  return true;
}

void ApiServer::handle_generation(HttpExchange& ex, ApiKind kind) {
  const double t_arrival = now_seconds();
  // The request keeps this engine (and its model version) to its end, even if it is replaced.
  const std::shared_ptr<Engine> engine_ref = engine();
  Engine& engine = *engine_ref;
  if (draining_) return ex.respond(error_response(error_for_status(503, "the server is shutting down")));

  CompletionParams p;
  if (auto e = parse_completion_request(ex.request().body, kind, &p)) return ex.respond(error_response(*e));
  EdgeHook* const edge = edge_;
  const std::string version = engine.model_version();
  const double no_confidence = std::numeric_limits<double>::quiet_NaN();
  if (edge && !p.model.empty() && p.model != opt_.served_model_name && edge->center_serves(p.model)) {
    std::string failure;
    if (!forward_to_center(ex, "model", version, no_confidence, {}, &failure))
      ex.respond(error_response(error_for_status(
          503, str_cat("the model '", p.model, "' is served by the center, which cannot be reached: ", failure))));
    return;
  }
  const std::shared_ptr<const ChatFormat> format = engine.chat_format();
  std::string prompt = p.prompt_text;
  if (kind == ApiKind::chat) {
    try {
      prompt = format->render(p.messages);
    } catch (const Error& e) {  // the template refused the conversation (raise_exception)
      return ex.respond(error_response(invalid_request("messages", e.what())));
    }
  }
  GenerationRequest greq;
  const TextTokenizer& tok = engine.tokenizer();
  if (auto e = build_generation_request(p, opt_.served_model_name, tok, engine.context_length(), prompt, &greq,
                                        kind == ApiKind::chat && format->special_tokens()))
    return ex.respond(error_response(*e));
  uint64_t seq = next_seq_.fetch_add(1);
  if (!greq.sampling.seed) greq.sampling.seed = opt_.seed + seq;
  greq.sampling.token_probs = edge != nullptr;
  std::vector<std::string> stops = greq.sampling.stop;
  if (kind == ApiKind::chat)
    for (const std::string& s : format->stop_strings()) stops.push_back(s);
  const int64_t n_prompt = int64_t(greq.prompt.size());

  if (!admit(engine))
    return ex.respond(
        error_response(error_for_status(429, str_cat("the server is at capacity (", engine.max_running(), " running + ",
                                                     opt_.max_queue, " queued); retry later"))));

  // A completion continues its prompt; a chat reply is a message of its own (text_stream.h).
  TextStream text(tok, stops,
                  kind == ApiKind::completion ? std::span<const int32_t>(greq.prompt) : std::span<const int32_t>());
  auto channel = std::make_shared<EventChannel>();
  uint64_t id = 0;
  try {
    id = engine.submit(std::move(greq), [channel](const TokenEvent& ev) { channel->push(ev); });
  } catch (const std::exception& e) {
    --in_flight_;  // not admitted after all
    return ex.respond(error_response(error_for_status(503, str_cat("the engine refused the request: ", e.what()))));
  }
  // The slot is held until the response is written, so that stop() never closes a
  // connection under a response still being sent.
  struct Release {
    ApiServer* self;
    Engine* engine;
    uint64_t id;
    ~Release() { self->finish_request(engine, id); }
  } release{this, &engine, id};
  bool shutdown_abort = !register_request(&engine, id);
  if (shutdown_abort) engine.abort(id);
  metrics_.counter("loom_prompt_tokens_total", "prompt tokens of admitted requests").inc(double(n_prompt));

  const bool chat = kind == ApiKind::chat;
  std::vector<int32_t> token_ids;  // p.return_token_ids: every token generated, in the last chunk
  const std::string rid = str_cat(chat ? "chatcmpl-" : "cmpl-", std::hex, seq, "-", created_);
  const int64_t created = int64_t(std::time(nullptr));
  const std::string answered_by = opt_.role.empty() ? "serve" : opt_.role;
  const std::string fingerprint = str_cat("loom-", answered_by, version.empty() ? "" : "-", version);
  HeaderList identity = {{"X-Loom-Answered-By", answered_by}};
  if (!version.empty()) identity.emplace_back("X-Loom-Model-Version", version);
  auto chunk = [&](const std::string& text, const char* finish) {
    json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}, {"logprobs", nullptr}};
    if (p.return_token_ids && finish) choice["token_ids"] = token_ids;
    if (chat)
      choice["delta"] = text.empty() && finish ? json::object() : json{{"content", text}};
    else
      choice["text"] = text;
    return json{{"id", rid},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", opt_.served_model_name},
                {"system_fingerprint", fingerprint},
                {"choices", json::array({choice})}};
  };

  bool client_gone = false;
  double t_abort = 0;
  auto abort_local = [&] {
    if (t_abort > 0) return;
    engine.abort(id);
    t_abort = now_seconds();
  };
  auto begin_stream = [&] {
    if (!p.stream || client_gone) return;
    HeaderList headers = identity;
    headers.emplace_back("Cache-Control", "no-cache");
    client_gone = !ex.start_stream(200, "text/event-stream", headers);
    if (!client_gone && chat) {
      json first = chunk("", nullptr);
      first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
      client_gone = !ex.send_chunk(sse(first));
    }
    if (client_gone) abort_local();
  };
  // An edge holds its first window of tokens back until it has decided who answers.
  bool deciding = edge != nullptr;
  if (!deciding) begin_stream();

  std::string body_text, held;
  int64_t n_generated = 0;
  double t_last = 0;
  bool stop_hit = false;
  double prob_sum = 0, prob_min = 1;
  int64_t prob_n = 0;
  double confidence = no_confidence;
  FinishReason engine_finish = FinishReason::none;
  std::string engine_error;  // engine_finish == error: why
  auto& ttft =
      metrics_.histogram("loom_time_to_first_token_seconds", "time from arrival to the first token", kTtftBuckets);
  auto& itl = metrics_.histogram("loom_inter_token_latency_seconds", "time between consecutive tokens", kItlBuckets);
  auto emit = [&](const std::string& delta) {
    if (delta.empty()) return;
    if (deciding)
      held += delta;
    else if (!p.stream)
      body_text += delta;
    else if (!client_gone && !ex.send_chunk(sse(chunk(delta, nullptr))))
      client_gone = true;
  };
  // The edge's decision: its confidence is the mean probability of the window's tokens.
  // Returns true when the request has been answered by the center (or refused).
  auto decide = [&]() -> bool {
    deciding = false;
    confidence = prob_n > 0 ? prob_sum / double(prob_n) : 1.0;
    if (confidence < edge->threshold() && !client_gone && engine_finish != FinishReason::abort) {
      std::string failure;
      if (forward_to_center(ex, "confidence", version, confidence, abort_local, &failure)) return true;
      if (!edge->answer_locally_when_center_down()) {
        abort_local();
        ex.respond(error_response(
            error_for_status(503, str_cat("the edge is not confident enough (", confidence, " < ", edge->threshold(),
                                          ") and the center cannot be reached: ", failure))));
        return true;
      }
      identity.emplace_back("X-Loom-Cascade", "center-unreachable");
    }
    count_cascade("edge", version, edge->center_version(), confidence);
    identity.emplace_back("X-Loom-Confidence", str_cat(confidence));
    identity.emplace_back("X-Loom-Confidence-Min", str_cat(prob_n > 0 ? prob_min : 1.0));
    begin_stream();
    emit(std::exchange(held, {}));
    return false;
  };
  while (true) {
    for (const TokenEvent& ev : channel->wait(opt_.poll_interval_s)) {
      if (ev.token >= 0 && !stop_hit) {
        double t = now_seconds();
        (n_generated == 0 ? ttft : itl).observe(t - (n_generated == 0 ? t_arrival : t_last));
        t_last = t;
        ++n_generated;
        if (p.return_token_ids) token_ids.push_back(ev.token);
        if (deciding && std::isfinite(ev.prob)) {
          prob_sum += ev.prob;
          prob_min = std::min(prob_min, ev.prob);
          ++prob_n;
        }
        emit(text.push_token(ev.token));
        if (text.stopped()) {
          stop_hit = true;
          abort_local();
        }
      }
      if (ev.finish != FinishReason::none) {
        engine_finish = ev.finish;
        engine_error = ev.error;
      }
    }
    if (deciding && (n_generated >= edge->window_tokens() || engine_finish != FinishReason::none || stop_hit)) {
      const bool answered_elsewhere = decide();
      if (answered_elsewhere) {
        metrics_.histogram("loom_e2e_request_latency_seconds", "time from arrival to the last token", kE2eBuckets)
            .observe(now_seconds() - t_arrival);
        return;
      }
    }
    if (engine_finish != FinishReason::none) break;
    if (!client_gone && ex.client_gone()) client_gone = true;
    if (client_gone) abort_local();
    // An engine that never confirms an abort must not pin this thread forever.
    if (t_abort > 0 && now_seconds() - t_abort > 10) break;
  }
  if (deciding) {  // left the loop undecided (an abort the engine never confirmed)
    deciding = false;
    emit(std::exchange(held, {}));
  }
  metrics_.counter("loom_generation_tokens_total", "tokens generated").inc(double(n_generated));
  metrics_.histogram("loom_e2e_request_latency_seconds", "time from arrival to the last token", kE2eBuckets)
      .observe(now_seconds() - t_arrival);

  // A stop string seen first makes the response complete, whatever the engine said after it.
  const bool failed = !stop_hit && engine_finish == FinishReason::error;
  const bool aborted =
      !stop_hit && !failed && engine_finish != FinishReason::stop && engine_finish != FinishReason::length;
  const char* finish = stop_hit || engine_finish == FinishReason::stop ? "stop" : "length";
  const char* outcome = failed ? "error" : aborted ? (client_gone ? "client_gone" : "abort") : finish;
  metrics_
      .counter("loom_request_finished_total", "finished generation requests by reason", {{"finish_reason", outcome}})
      .inc();
  if (failed) std::fprintf(stderr, "[serve] %s failed: %s\n", rid.c_str(), engine_error.c_str());
  ex.note(str_cat("id=", rid, " tokens=", n_prompt, "+", n_generated, " finish=", outcome));
  if (client_gone) {
    if (!p.stream) ex.abandon();
    return;  // nobody to answer; a stream just ends with the connection
  }
  // An error after the stream began goes out as its last event.
  auto answer_error = [&](const ApiError& e) {
    if (!p.stream || !ex.streaming()) return ex.respond(error_response(e));
    ex.send_chunk("data: " + error_response(e).body + "\n\n");
    ex.end_stream();
  };
  if (failed) return answer_error(error_for_status(500, engine_error));
  if (aborted)
    return answer_error(error_for_status(503, "the request was aborted because the server is shutting down"));
  emit(text.finish());
  json usage = {
      {"prompt_tokens", n_prompt}, {"completion_tokens", n_generated}, {"total_tokens", n_prompt + n_generated}};
  if (p.stream) {
    json last = chunk("", finish);
    last["usage"] = usage;
    std::string tail = sse(last);
    if (p.include_usage) {
      json u = chunk("", nullptr);
      u["choices"] = json::array();
      u["usage"] = usage;
      tail += sse(u);
    }
    tail += "data: [DONE]\n\n";
    if (ex.send_chunk(tail)) ex.end_stream();
    return;
  }
  json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
  if (p.return_token_ids) choice["token_ids"] = token_ids;
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", body_text}};
  else
    choice["text"] = body_text;
  HttpResponse r;
  r.headers = identity;
  r.body = dump({{"id", rid},
                 {"object", chat ? "chat.completion" : "text_completion"},
                 {"created", created},
                 {"model", opt_.served_model_name},
                 {"system_fingerprint", fingerprint},
                 {"choices", json::array({choice})},
                 {"usage", usage}});
  ex.respond(r);
}

}  // namespace loom::serve
