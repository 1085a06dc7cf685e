// Validation of OpenAI completion and chat requests (see openai_request.h).
#include "loom/serve/openai_request.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/infer/sampler.h"

namespace loom::serve {

using nlohmann::json;

ApiError invalid_request(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

ApiError error_for_status(int status, std::string message) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  switch (status) {
    case 401:
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case 404: e.type = "not_found_error"; break;
    case 413: e.code = "request_too_large"; break;
    case 429:
      e.type = "rate_limit_error";
      e.code = "queue_full";
      break;
    case 503: e.type = "service_unavailable"; break;
    default:
      if (status >= 500) e.type = "server_error";
  }
  return e;
}

net::HttpResponse error_response(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  net::HttpResponse r;
  r.status = e.status;
  r.body = json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

namespace {

// Field access where JSON null means "not given", as OpenAI clients send it.
const json* field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> get_number(const json& obj, const char* name, double lo, double hi, double* out) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) return invalid_request(name, str_cat("'", name, "' must be a number"));
  double x = v->get<double>();
  if (!(x >= lo && x <= hi))
    return invalid_request(name, str_cat("'", name, "' must be between ", lo, " and ", hi, ", got ", x));
  *out = x;
  return std::nullopt;
}

std::optional<ApiError> get_integer(const json& obj, const char* name, std::optional<int64_t>* out) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) return invalid_request(name, str_cat("'", name, "' must be an integer"));
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
    return invalid_request(name, str_cat("'", name, "' is too large"));
  *out = v->get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& obj, const char* name, bool* out) {
  const json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return invalid_request(name, str_cat("'", name, "' must be a boolean"));
  *out = v->get<bool>();
  return std::nullopt;
}

// Fields we accept only at their default value, with the reason.
std::optional<ApiError> check_unsupported(const json& body) {
  std::optional<int64_t> n;
  if (auto e = get_integer(body, "n", &n)) return e;
  if (n && *n != 1) return invalid_request("n", "only n=1 is supported");
  std::optional<int64_t> best_of;
  if (auto e = get_integer(body, "best_of", &best_of)) return e;
  if (best_of && *best_of != 1) return invalid_request("best_of", "only best_of=1 is supported");
  bool echo = false;
  if (auto e = get_bool(body, "echo", &echo)) return e;
  if (echo) return invalid_request("echo", "echo is not supported");
  if (const json* v = field(body, "logprobs"); v && !(v->is_boolean() && !v->get<bool>()))
    return invalid_request("logprobs", "logprobs are not supported");
  if (field(body, "suffix")) return invalid_request("suffix", "suffix is not supported");
  for (const char* name : {"frequency_penalty", "presence_penalty"}) {
    double x = 0;
    if (auto e = get_number(body, name, -2.0, 2.0, &x)) return e;
    if (x != 0) return invalid_request(name, str_cat("'", name, "' is not supported (only 0)"));
  }
  if (const json* v = field(body, "logit_bias"); v && !(v->is_object() && v->empty()))
    return invalid_request("logit_bias", "logit_bias is not supported");
  if (const json* v = field(body, "tools"); v && !(v->is_array() && v->empty()))
    return invalid_request("tools", "tools are not supported");
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json& body, CompletionParams* out) {
  const json* v = field(body, "prompt");
  if (!v) return invalid_request("prompt", "'prompt' is required");
  if (v->is_string()) {
    out->prompt_text = v->get<std::string>();
    return std::nullopt;
  }
  if (v->is_array() && v->size() == 1 && (*v)[0].is_string()) {
    out->prompt_text = (*v)[0].get<std::string>();
    return std::nullopt;
  }
  if (v->is_array() && !v->empty() && (*v)[0].is_number_integer()) {
    for (const json& id : *v) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        return invalid_request("prompt", "a token-id prompt must be an array of non-negative integers");
      out->prompt_ids.push_back(int32_t(id.get<int64_t>()));
    }
    out->prompt_is_ids = true;
    return std::nullopt;
  }
  return invalid_request("prompt", "'prompt' must be a string or an array of token ids (one prompt per request)");
}

std::optional<ApiError> parse_messages(const json& body, CompletionParams* out) {
  const json* v = field(body, "messages");
  if (!v) return invalid_request("messages", "'messages' is required");
  if (!v->is_array() || v->empty()) return invalid_request("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    std::string where = str_cat("messages[", i, "]");
    if (!m.is_object()) return invalid_request(where, str_cat("'", where, "' must be an object"));
    const json* role = field(m, "role");
    if (!role || !role->is_string())
      return invalid_request(where + ".role", str_cat("'", where, ".role' must be a string"));
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant")
      return invalid_request(where + ".role",
                             str_cat("'", where, ".role' must be system, user or assistant, got '", r, "'"));
    ChatMessage msg{r, ""};
    const json* c = field(m, "content");
    if (c && c->is_string()) {
      msg.content = c->get<std::string>();
    } else if (c && c->is_array()) {
      for (const json& part : *c) {
        const json* type = part.is_object() ? field(part, "type") : nullptr;
        const json* text = part.is_object() ? field(part, "text") : nullptr;
        if (!type || *type != "text" || !text || !text->is_string())
          return invalid_request(where + ".content",
                                 "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
        msg.content += text->get<std::string>();
      }
    } else if (c || r != "assistant") {
      return invalid_request(where + ".content",
                             str_cat("'", where, ".content' must be a string or an array of text parts"));
    }
    out->messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const json& body, CompletionParams* out) {
  const json* v = field(body, "stop");
  if (!v) return std::nullopt;
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 4) return invalid_request("stop", "at most 4 stop sequences are allowed");
    for (const json& s : *v) {
      if (!s.is_string()) return invalid_request("stop", "'stop' must be a string or an array of strings");
      stops.push_back(s.get<std::string>());
    }
  } else {
    return invalid_request("stop", "'stop' must be a string or an array of strings");
  }
  for (const auto& s : stops)
    if (s.empty()) return invalid_request("stop", "stop sequences must not be empty");
  out->sampling.stop = std::move(stops);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_completion_request(std::string_view text, ApiKind kind, CompletionParams* out) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return invalid_request("", "the request body is not valid JSON");
  if (!body.is_object()) return invalid_request("", "the request body must be a JSON object");
  out->kind = kind;

  const json* model = field(body, "model");
  if (!model) return invalid_request("model", "'model' is required (see GET /v1/models)");
  if (!model->is_string()) return invalid_request("model", "'model' must be a string");
  out->model = model->get<std::string>();

  if (auto e = kind == ApiKind::completion ? parse_prompt(body, out) : parse_messages(body, out)) return e;
  if (auto e = check_unsupported(body)) return e;

  // The sampling ranges are loom generate's too (infer/sampler.h).
  auto refuse_if = [](const char* param, const std::string& problem) -> std::optional<ApiError> {
    if (problem.empty()) return std::nullopt;
    return invalid_request(param, problem);
  };
  auto quoted = [](const char* name) { return str_cat("'", name, "'"); };
  const char* max_name =
      kind == ApiKind::chat && field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto e = get_integer(body, max_name, &out->max_tokens)) return e;
  if (out->max_tokens)
    if (auto e = refuse_if(max_name, infer::max_tokens_problem(*out->max_tokens, quoted(max_name)))) return e;
  SamplingParams& sp = out->sampling;
  if (auto e = get_number(body, "temperature", -HUGE_VAL, HUGE_VAL, &sp.temperature)) return e;
  if (auto e = refuse_if("temperature", infer::temperature_problem(sp.temperature, quoted("temperature")))) return e;
  if (auto e = get_number(body, "top_p", -HUGE_VAL, HUGE_VAL, &sp.top_p)) return e;
  if (auto e = refuse_if("top_p", infer::top_p_problem(sp.top_p, quoted("top_p")))) return e;
  std::optional<int64_t> top_k;
  if (auto e = get_integer(body, "top_k", &top_k)) return e;
  if (top_k)
    if (auto e = refuse_if("top_k", infer::top_k_problem(*top_k, quoted("top_k")))) return e;
  sp.top_k = infer::user_top_k(top_k.value_or(0));
  std::optional<int64_t> seed;
  if (auto e = get_integer(body, "seed", &seed)) return e;
  if (seed) sp.seed = uint64_t(*seed);
  if (auto e = parse_stop(body, out)) return e;
  if (auto e = get_bool(body, "stream", &out->stream)) return e;
  if (auto e = get_bool(body, "return_token_ids", &out->return_token_ids)) return e;
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) return invalid_request("stream_options", "'stream_options' must be an object");
    if (!out->stream) return invalid_request("stream_options", "'stream_options' is only allowed with stream=true");
    if (auto e = get_bool(*so, "include_usage", &out->include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  return std::nullopt;
}

std::optional<ApiError> build_generation_request(const CompletionParams& p, const std::string& served_model,
                                                 const TextTokenizer& tok, int64_t ctx, const std::string& prompt,
                                                 GenerationRequest* out, bool special_tokens) {
  if (p.model != served_model)
    return invalid_request(
        "model", str_cat("the model '", p.model, "' does not exist; this server serves '", served_model, "'"));
  out->prompt = p.prompt_is_ids ? p.prompt_ids : special_tokens ? tok.encode_special(prompt) : tok.encode(prompt);
  const char* pname = p.kind == ApiKind::chat ? "messages" : "prompt";
  int64_t n = int64_t(out->prompt.size());
  if (n == 0) return invalid_request(pname, "the prompt is empty");
  for (int32_t id : out->prompt)
    if (id >= tok.vocab_size())
      return invalid_request(pname, str_cat("token id ", id, " is outside the vocabulary of ", tok.vocab_size()));
  if (n >= ctx)
    return invalid_request(pname, str_cat("the prompt has ", n, " tokens but the model's context is ", ctx,
                                          " tokens, leaving no room to generate; shorten it"));
  out->sampling = p.sampling;
  const char* max_name = "max_tokens";
  if (p.max_tokens) {
    if (*p.max_tokens > ctx - n)
      return invalid_request(
          max_name, str_cat("max_tokens=", *p.max_tokens, " plus the prompt's ", n,
                            " tokens exceeds the model's context of ", ctx, " tokens; ask for at most ", ctx - n));
    out->sampling.max_tokens = *p.max_tokens;
  } else {
    out->sampling.max_tokens = p.kind == ApiKind::chat ? ctx - n : std::min<int64_t>(16, ctx - n);
  }
  return std::nullopt;
}

}  // namespace loom::serve
