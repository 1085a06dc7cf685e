// Turns one request's generated tokens into the text the client sees: valid UTF-8 deltas,
// cut before the first stop string, holding back any tail that could still become one.
#pragma once
#include <string>
#include <vector>

#include "loom/infer/stop_strings.h"
#include "loom/serve/tokenizer.h"

namespace loom::serve {

class TextStream {
 public:
  TextStream(const TextTokenizer& tok, std::vector<std::string> stops);

  // Text that may be sent now after token `id` (possibly empty). Once a stop string shows
  // up, stopped() is true and later calls return nothing.
  std::string push_token(int32_t id);
  // The held-back tail at the end of generation (empty after a stop).
  std::string finish();

  bool stopped() const { return stops_.stopped(); }
  const std::string& text() const { return emitted_; }  // everything returned so far

 private:
  std::string emit(std::string s);

  const TextTokenizer& tok_;
  infer::StopStringMatcher stops_;
  Utf8Assembler utf8_;
  std::string emitted_;
};

// The full completion text for `tokens` as the server would send it (the reference for tests
// that compare the server with an offline run).
std::string render_completion(const TextTokenizer& tok, const std::vector<int32_t>& tokens,
                              const std::vector<std::string>& stops, bool* stopped = nullptr);

}  // namespace loom::serve
