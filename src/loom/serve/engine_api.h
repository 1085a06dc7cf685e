// What the HTTP server needs from an inference engine, as an abstract class: submit a
// tokenized request with sampling parameters and a per-token callback, abort it, read
// gauges. Adapters wrap the real engine (loom::infer) or a fake one in tests.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "loom/infer/finish_reason.h"
#include "loom/infer/sampler.h"
#include "loom/serve/tokenizer.h"

namespace loom::serve {

class ChatFormat;  // chat_template.h

// The request types are infer's: the server speaks them from the HTTP parser to the engine.
using infer::FinishReason;  // error: the engine could not go on (TokenEvent::error says why)
using infer::SamplingParams;

struct GenerationRequest {
  std::vector<int32_t> prompt;  // non-empty, every id < vocab size
  // sampling.max_tokens >= 1 and prompt.size() + max_tokens <= context_length();
  // sampling.token_probs: report each token's probability (TokenEvent::prob). The server
  // applies sampling.stop to the text itself; an engine need not.
  SamplingParams sampling;
};

// One step of a request's life. Tokens arrive in order; exactly one event carries a
// finish reason other than `none`, and it is the last one (it may also carry a token).
struct TokenEvent {
  int32_t token = -1;  // -1: no token in this event
  FinishReason finish = FinishReason::none;
  std::string error;  // finish == error: what went wrong, for the client
  // SamplingParams::token_probs: the token's probability under the model (NaN otherwise).
  double prob = std::numeric_limits<double>::quiet_NaN();
};
// Called from the engine's thread; must be quick and must not call back into the engine.
using TokenEventSink = std::function<void(const TokenEvent&)>;

struct EngineStats {
  int64_t running = 0;  // sequences being stepped
  int64_t waiting = 0;  // accepted but not yet scheduled
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t spec_proposed = 0;  // speculative decoding: tokens proposed and scored so far
  int64_t spec_accepted = 0;  //   and how many of them the target accepted
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const TextTokenizer& tokenizer() const = 0;
  virtual int64_t context_length() const = 0;
  // How many sequences the engine steps together; the server admits this many plus its
  // queue bound before answering 429.
  virtual int64_t max_running() const = 0;
  // Thread-safe. Returns the request's id; `sink` receives its events until the final one.
  virtual uint64_t submit(GenerationRequest req, TokenEventSink sink) = 0;
  // Thread-safe; unknown or finished ids are ignored. An aborted request still gets its final
  // event (FinishReason::abort) once its KV blocks are freed.
  virtual void abort(uint64_t id) = 0;
  virtual EngineStats stats() const = 0;
  // The model's version ("" when it has none): a cascade's checkpoint version (serve/cascade),
  // reported in system_fingerprint and X-Loom-Model-Version.
  virtual std::string model_version() const { return ""; }
  // How chat requests become a prompt: the model's own template, or ChatML (the default).
  virtual std::shared_ptr<const ChatFormat> chat_format() const;
};

}  // namespace loom::serve
