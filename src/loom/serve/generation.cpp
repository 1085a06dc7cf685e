// POST /v1/completions and /v1/chat/completions: validate, route (a cascade edge may send the
// request to its center), tokenize, admit and submit to the engine, then hand the request to
// its GenerationStream, which answers it.
#include <ctime>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/serve/api_server.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/generation_stream.h"
#include "loom/serve/response_writer.h"
#include "loom/serve/text_stream.h"

namespace loom::serve {

void ApiServer::handle_generation(net::HttpExchange& ex, ApiKind kind) {
  const double t_arrival = now_seconds();
  // The request keeps this engine (and its model version) to its end, even if it is replaced.
  const std::shared_ptr<Engine> engine_ref = engine();
  Engine& engine = *engine_ref;
  if (draining_) return ex.respond(error_response(error_for_status(503, "the server is shutting down")));

  CompletionParams p;
  if (auto e = parse_completion_request(ex.request().body, kind, &p)) return ex.respond(error_response(*e));
  const std::string version = engine.model_version();
  if (edge_ && p.model != opt_.served_model_name && edge_->route_model(ex, p.model, version)) return;
  const bool chat = kind == ApiKind::chat;
  const std::shared_ptr<const ChatFormat> format = engine.chat_format();
  std::string prompt = p.prompt_text;
  if (chat) {
    try {
      prompt = format->render(p.messages);
    } catch (const Error& e) {  // the template refused the conversation (raise_exception)
      return ex.respond(error_response(invalid_request("messages", e.what())));
    }
  }
  GenerationRequest greq;
  const TextTokenizer& tok = engine.tokenizer();
  if (auto e = build_generation_request(p, opt_.served_model_name, tok, engine.context_length(), prompt, &greq,
                                        chat && format->special_tokens()))
    return ex.respond(error_response(*e));
  const uint64_t seq = next_seq_.fetch_add(1);
  if (!greq.sampling.seed) greq.sampling.seed = opt_.seed + seq;
  greq.sampling.token_probs = edge_ != nullptr;  // the cascade's confidence
  std::vector<std::string> stops = greq.sampling.stop;
  if (chat)
    for (const std::string& s : format->stop_strings()) stops.push_back(s);
  StreamSetup setup;
  setup.t_arrival = t_arrival;
  setup.n_prompt = int64_t(greq.prompt.size());
  setup.poll_interval_s = opt_.poll_interval_s;
  setup.return_token_ids = p.return_token_ids;
  setup.stream = p.stream;
  setup.edge_version = version;
  setup.edge = edge_;
  setup.log_id = str_cat(chat ? "chatcmpl-" : "cmpl-", std::hex, seq, "-", created_);

  if (!admit(engine))
    return ex.respond(
        error_response(error_for_status(429, str_cat("the server is at capacity (", engine.max_running(), " running + ",
                                                     opt_.max_queue, " queued); retry later"))));
  // A completion continues its prompt; a chat reply is a message of its own (text_stream.h).
  TextStream text(tok, stops, chat ? std::span<const int32_t>() : std::span<const int32_t>(greq.prompt));
  auto events = std::make_shared<EventChannel>();
  try {
    setup.engine_id = engine.submit(std::move(greq), [events](const TokenEvent& ev) { events->push(ev); });
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
  } release{this, &engine, setup.engine_id};
  if (!register_request(&engine, setup.engine_id)) engine.abort(setup.engine_id);  // shutting down
  metrics_.counter("loom_prompt_tokens_total", "prompt tokens of admitted requests").inc(double(setup.n_prompt));

  const std::string answered_by = opt_.role.empty() ? "serve" : opt_.role;
  setup.headers = {{"X-Loom-Answered-By", answered_by}};
  if (!version.empty()) setup.headers.emplace_back("X-Loom-Model-Version", version);
  std::unique_ptr<ResponseWriter> writer =
      make_response_writer(ex, p,
                           {setup.log_id, int64_t(std::time(nullptr)), opt_.served_model_name,
                            str_cat("loom-", answered_by, version.empty() ? "" : "-", version)});
  GenerationStream(ex, engine, std::move(events), text, *writer, metrics_, std::move(setup)).run();
}

}  // namespace loom::serve
