// How a generation's answer goes out: one writer per transport (server-sent events, or one
// JSON body at the end), each in the completions or the chat format (ApiKind). The writer owns
// the OpenAI shapes of chunks and bodies; what to write and when is GenerationStream's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/net/http_server.h"
#include "loom/serve/openai_request.h"

namespace loom::serve {

// What every chunk or body names: its id ("cmpl-..." / "chatcmpl-..."), creation time, the
// served model and the system fingerprint (role and model version).
struct ResponseIdentity {
  std::string id;
  int64_t created = 0;
  std::string model;
  std::string fingerprint;
};

struct TokenUsage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // The response's head with `headers` (a stream sends it now; a JSON body keeps them for the
  // end). False: the client is gone.
  virtual bool begin(const net::HeaderList& headers) = 0;
  // A piece of the answer's text. False: the client is gone.
  virtual bool text(const std::string& delta) = 0;
  // The answer ends with finish_reason ("stop" or "length"); token_ids (every token generated)
  // is given when the request asked for them (return_token_ids).
  virtual void finish(const char* finish_reason, const TokenUsage& usage, const std::vector<int32_t>* token_ids) = 0;
  // An error instead of the answer, or as a begun stream's last event.
  virtual void fail(const ApiError& e) = 0;
};

// A stream (server-sent events) when `p.stream`, else one JSON body; in p.kind's format.
std::unique_ptr<ResponseWriter> make_response_writer(net::HttpExchange& ex, const CompletionParams& p,
                                                     ResponseIdentity identity);

}  // namespace loom::serve
