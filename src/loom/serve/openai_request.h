// OpenAI request bodies (/v1/completions, /v1/chat/completions) parsed and validated into a
// typed struct, and OpenAI-style error objects. Every refusal names the offending field in
// `param` and says what would be accepted.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/net/http.h"
#include "loom/serve/engine_api.h"

namespace loom::serve {

// {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
ApiError invalid_request(std::string param, std::string message);
net::HttpResponse error_response(const ApiError& e);
// The error for a status the HTTP layer produces by itself (404, 413, 431, ...).
ApiError error_for_status(int status, std::string message);

enum class ApiKind { completion, chat };

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

struct CompletionParams {
  ApiKind kind = ApiKind::completion;
  std::string model;
  std::string prompt_text;          // completions: the prompt as text ...
  std::vector<int32_t> prompt_ids;  // ... or as token ids (prompt_is_ids)
  bool prompt_is_ids = false;
  std::vector<ChatMessage> messages;  // chat
  // The user's limit (max_tokens or max_completion_tokens); absent, build_generation_request
  // picks one from the context and sets sampling.max_tokens.
  std::optional<int64_t> max_tokens;
  // temperature, top_p, top_k (0: off), seed (absent: the server seeds it), stop.
  SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // A loom extension (as vLLM's): the answer's token ids in each choice ("token_ids"), so a
  // client can score exactly the tokens the model chose (text re-tokenized may differ).
  bool return_token_ids = false;
};

// Parses the JSON body and checks every field's type and range (nothing model-dependent).
std::optional<ApiError> parse_completion_request(std::string_view body, ApiKind kind, CompletionParams* out);

// Checks the parts that depend on the served model (name, context length, vocabulary),
// tokenizes, and fills the engine request. `prompt` must already hold the prompt text
// (the chat template applied for chat). Completions default to 16 new tokens, chat to the
// rest of the context. `special_tokens`: the prompt's special-token texts are those tokens (a
// model's own chat template rendered it).
std::optional<ApiError> build_generation_request(const CompletionParams& p, const std::string& served_model,
                                                 const TextTokenizer& tok, int64_t context_length,
                                                 const std::string& prompt, GenerationRequest* out,
                                                 bool special_tokens = false);

}  // namespace loom::serve
