// The completions and chat answers as OpenAI shapes them: chunks of server-sent events
// ("text_completion" / "chat.completion.chunk", then usage and [DONE]) or one JSON body
// ("text_completion" / "chat.completion").
#include "loom/serve/response_writer.h"

#include <nlohmann/json.hpp>

namespace loom::serve {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

json usage_json(const TokenUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json envelope(const ResponseIdentity& id, const char* object, json choice) {
  return json{{"id", id.id},
              {"object", object},
              {"created", id.created},
              {"model", id.model},
              {"system_fingerprint", id.fingerprint},
              {"choices", json::array({std::move(choice)})}};
}

// Server-sent events: a chunk per piece of text, then one with the finish reason and usage,
// an optional usage-only chunk (stream_options.include_usage), and [DONE].
class SseWriter final : public ResponseWriter {
 public:
  SseWriter(net::HttpExchange& ex, const CompletionParams& p, ResponseIdentity id)
      : ex_(ex), chat_(p.kind == ApiKind::chat), include_usage_(p.include_usage), id_(std::move(id)) {}

  bool begin(const net::HeaderList& headers) override {
    net::HeaderList h = headers;
    h.emplace_back("Cache-Control", "no-cache");
    if (!ex_.start_stream(200, "text/event-stream", h)) return false;
    if (!chat_) return true;
    json first = chunk("", nullptr, nullptr);
    first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
    return ex_.send_chunk(sse(first));
  }
  bool text(const std::string& delta) override { return ex_.send_chunk(sse(chunk(delta, nullptr, nullptr))); }
  void finish(const char* finish_reason, const TokenUsage& usage, const std::vector<int32_t>* token_ids) override {
    json last = chunk("", finish_reason, token_ids);
    last["usage"] = usage_json(usage);
    std::string tail = sse(last);
    if (include_usage_) {
      json u = chunk("", nullptr, nullptr);
      u["choices"] = json::array();
      u["usage"] = usage_json(usage);
      tail += sse(u);
    }
    tail += "data: [DONE]\n\n";
    if (ex_.send_chunk(tail)) ex_.end_stream();
  }
  void fail(const ApiError& e) override {
    if (!ex_.streaming()) return ex_.respond(error_response(e));
    ex_.send_chunk("data: " + error_response(e).body + "\n\n");
    ex_.end_stream();
  }

 private:
  json chunk(const std::string& text, const char* finish, const std::vector<int32_t>* token_ids) const {
    json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}, {"logprobs", nullptr}};
    if (token_ids) choice["token_ids"] = *token_ids;
    if (chat_)
      choice["delta"] = text.empty() && finish ? json::object() : json{{"content", text}};
    else
      choice["text"] = text;
    return envelope(id_, chat_ ? "chat.completion.chunk" : "text_completion", std::move(choice));
  }

  net::HttpExchange& ex_;
  const bool chat_, include_usage_;
  const ResponseIdentity id_;
};

// One JSON body once the answer is complete.
class JsonWriter final : public ResponseWriter {
 public:
  JsonWriter(net::HttpExchange& ex, const CompletionParams& p, ResponseIdentity id)
      : ex_(ex), chat_(p.kind == ApiKind::chat), id_(std::move(id)) {}

  bool begin(const net::HeaderList& headers) override {
    headers_ = headers;
    return true;
  }
  bool text(const std::string& delta) override {
    text_ += delta;
    return true;
  }
  void finish(const char* finish_reason, const TokenUsage& usage, const std::vector<int32_t>* token_ids) override {
    json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", nullptr}};
    if (token_ids) choice["token_ids"] = *token_ids;
    if (chat_)
      choice["message"] = {{"role", "assistant"}, {"content", text_}};
    else
      choice["text"] = text_;
    json body = envelope(id_, chat_ ? "chat.completion" : "text_completion", std::move(choice));
    body["usage"] = usage_json(usage);
    net::HttpResponse r;
    r.headers = headers_;
    r.body = dump(body);
    ex_.respond(r);
  }
  void fail(const ApiError& e) override { ex_.respond(error_response(e)); }

 private:
  net::HttpExchange& ex_;
  const bool chat_;
  const ResponseIdentity id_;
  net::HeaderList headers_;
  std::string text_;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_response_writer(net::HttpExchange& ex, const CompletionParams& p,
                                                     ResponseIdentity identity) {
  if (p.stream) return std::make_unique<SseWriter>(ex, p, std::move(identity));
  return std::make_unique<JsonWriter>(ex, p, std::move(identity));
}

}  // namespace loom::serve
