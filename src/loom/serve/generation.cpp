// POST /v1/completions and /v1/chat/completions: validate, admit, submit to the engine,
// then relay tokens as one JSON response or as server-sent events, aborting the engine
// request when the client goes away, a stop string appears, or the server shuts down.
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/serve/api_server.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/text_stream.h"

namespace loom::serve {

using nlohmann::json;

namespace {

const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                          0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                         0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5};
const std::vector<double> kE2eBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                                         15.0, 20.0, 30.0, 40.0, 50.0, 60.0};

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

void ApiServer::handle_generation(HttpExchange& ex, ApiKind kind) {
  const double t_arrival = now_seconds();
  Engine& engine = *engine_.load();
  if (draining_) return ex.respond(error_response(error_for_status(503, "the server is shutting down")));

  CompletionParams p;
  if (auto e = parse_completion_request(ex.request().body, kind, &p)) return ex.respond(error_response(*e));
  std::string prompt = kind == ApiKind::chat ? render_chat(p.messages) : p.prompt_text;
  GenerationRequest greq;
  const TextTokenizer& tok = engine.tokenizer();
  if (auto e = build_generation_request(p, opt_.served_model_name, tok, engine.context_length(), prompt, &greq))
    return ex.respond(error_response(*e));
  uint64_t seq = next_seq_.fetch_add(1);
  if (!p.seed) greq.sampling.seed = opt_.seed + seq;
  std::vector<std::string> stops = p.stop;
  if (kind == ApiKind::chat) stops.push_back(kChatTurnEnd);
  const int64_t n_prompt = int64_t(greq.prompt.size());

  if (!admit(engine))
    return ex.respond(error_response(error_for_status(
        429, str_cat("the server is at capacity (", engine.max_running(), " running + ", opt_.max_queue,
                     " queued); retry later"))));

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
    uint64_t id;
    ~Release() { self->finish_request(id); }
  } release{this, id};
  bool shutdown_abort = !register_request(id);
  if (shutdown_abort) engine.abort(id);
  metrics_.counter("loom_prompt_tokens_total", "prompt tokens of admitted requests").inc(double(n_prompt));

  const bool chat = kind == ApiKind::chat;
  const std::string rid = str_cat(chat ? "chatcmpl-" : "cmpl-", std::hex, seq, "-", created_);
  const int64_t created = int64_t(std::time(nullptr));
  auto chunk = [&](const std::string& text, const char* finish) {
    json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}, {"logprobs", nullptr}};
    if (chat) choice["delta"] = text.empty() && finish ? json::object() : json{{"content", text}};
    else choice["text"] = text;
    return json{{"id", rid}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created}, {"model", opt_.served_model_name}, {"choices", json::array({choice})}};
  };

  bool client_gone = false;
  if (p.stream) {
    client_gone = !ex.start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    if (!client_gone && chat) {
      json first = chunk("", nullptr);
      first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
      client_gone = !ex.send_chunk(sse(first));
    }
    if (client_gone) engine.abort(id);
  }

  TextStream text(tok, stops);
  std::string body_text;
  int64_t n_generated = 0;
  double t_last = 0, t_abort = 0;
  bool stop_hit = false;
  FinishReason engine_finish = FinishReason::none;
  std::string engine_error;  // engine_finish == error: why
  auto& ttft = metrics_.histogram("loom_time_to_first_token_seconds", "time from arrival to the first token", kTtftBuckets);
  auto& itl = metrics_.histogram("loom_inter_token_latency_seconds", "time between consecutive tokens", kItlBuckets);
  auto emit = [&](const std::string& delta) {
    if (delta.empty()) return;
    if (!p.stream) body_text += delta;
    else if (!client_gone && !ex.send_chunk(sse(chunk(delta, nullptr)))) client_gone = true;
  };
  while (engine_finish == FinishReason::none) {
    for (const TokenEvent& ev : channel->wait(opt_.poll_interval_s)) {
      if (ev.token >= 0 && !stop_hit) {
        double t = now_seconds();
        (n_generated == 0 ? ttft : itl).observe(t - (n_generated == 0 ? t_arrival : t_last));
        t_last = t;
        ++n_generated;
        emit(text.push_token(ev.token));
        if (text.stopped()) {
          stop_hit = true;
          engine.abort(id);
          t_abort = now_seconds();
        }
      }
      if (ev.finish != FinishReason::none) {
        engine_finish = ev.finish;
        engine_error = ev.error;
      }
    }
    if (engine_finish != FinishReason::none) break;
    if (!client_gone && ex.client_gone()) client_gone = true;
    if (client_gone && t_abort == 0) {
      engine.abort(id);
      t_abort = now_seconds();
    }
    // An engine that never confirms an abort must not pin this thread forever.
    if (t_abort > 0 && now_seconds() - t_abort > 10) break;
  }
  metrics_.counter("loom_generation_tokens_total", "tokens generated").inc(double(n_generated));
  metrics_.histogram("loom_e2e_request_latency_seconds", "time from arrival to the last token", kE2eBuckets)
      .observe(now_seconds() - t_arrival);

  // A stop string seen first makes the response complete, whatever the engine said after it.
  const bool failed = !stop_hit && engine_finish == FinishReason::error;
  const bool aborted = !stop_hit && !failed && engine_finish != FinishReason::stop &&
                       engine_finish != FinishReason::length;
  const char* finish = stop_hit || engine_finish == FinishReason::stop ? "stop" : "length";
  const char* outcome = failed ? "error" : aborted ? (client_gone ? "client_gone" : "abort") : finish;
  metrics_.counter("loom_request_finished_total", "finished generation requests by reason",
                   {{"finish_reason", outcome}}).inc();
  if (failed) std::fprintf(stderr, "[serve] %s failed: %s\n", rid.c_str(), engine_error.c_str());
  ex.note(str_cat("id=", rid, " tokens=", n_prompt, "+", n_generated, " finish=", outcome));
  if (client_gone) {
    if (!p.stream) ex.abandon();
    return;  // nobody to answer; a stream just ends with the connection
  }
  // An error after the stream began goes out as its last event.
  auto answer_error = [&](const ApiError& e) {
    if (!p.stream) return ex.respond(error_response(e));
    ex.send_chunk("data: " + error_response(e).body + "\n\n");
    ex.end_stream();
  };
  if (failed) return answer_error(error_for_status(500, engine_error));
  if (aborted)
    return answer_error(error_for_status(503, "the request was aborted because the server is shutting down"));
  emit(text.finish());
  json usage = {{"prompt_tokens", n_prompt}, {"completion_tokens", n_generated},
                {"total_tokens", n_prompt + n_generated}};
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
  if (chat) choice["message"] = {{"role", "assistant"}, {"content", body_text}};
  else choice["text"] = body_text;
  HttpResponse r;
  r.body = dump({{"id", rid}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                 {"model", opt_.served_model_name}, {"choices", json::array({choice})}, {"usage", usage}});
  ex.respond(r);
}

}  // namespace loom::serve
