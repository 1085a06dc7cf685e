// Turns one request's generated tokens into the text the client sees: the ids decoded together
// (not token by token, which loses SentencePiece's word boundaries), as valid UTF-8 deltas, cut
// before the first stop string, holding back any tail that could still become one. Every
// streaming consumer (the server, `loom generate`, `loom chat`) goes through it.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "loom/infer/decode_stream.h"
#include "loom/infer/stop_strings.h"
#include "loom/serve/tokenizer.h"

namespace loom::serve {

class TextStream {
 public:
  // Without `prompt` the text is the reply decoded on its own, as a chat message reads (a
  // SentencePiece reply loses its first leading space); with it, the text that follows the
  // prompt, as a completion continues it (decode(prompt + reply) less decode(prompt)).
  TextStream(const TextTokenizer& tok, std::vector<std::string> stops, std::span<const int32_t> prompt = {});

  // Text that may be sent now after token `id` (possibly empty). Once a stop string shows
  // up, stopped() is true and later calls return nothing.
  std::string push_token(int32_t id);
  // The held-back tail at the end of generation (empty after a stop).
  std::string finish();

  bool stopped() const { return stops_.stopped(); }
  const std::string& text() const { return emitted_; }  // everything returned so far

 private:
  std::string emit(std::string s);

  infer::DecodeStream decode_;
  infer::StopStringMatcher stops_;
  Utf8Assembler utf8_;
  std::string emitted_;
};

// The full completion text for `tokens` as the server would send it (the reference for tests
// that compare the server with an offline run); `prompt` as for TextStream.
std::string render_completion(const TextTokenizer& tok, const std::vector<int32_t>& tokens,
                              const std::vector<std::string>& stops, bool* stopped = nullptr,
                              std::span<const int32_t> prompt = {});

}  // namespace loom::serve
