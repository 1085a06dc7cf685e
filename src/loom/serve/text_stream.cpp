// Incrementally decoded text with its stop strings cut (see text_stream.h).
#include "loom/serve/text_stream.h"

#include "loom/serve/engine_api.h"

namespace loom::serve {

TextStream::TextStream(const TextTokenizer& tok, std::vector<std::string> stops, std::span<const int32_t> prompt)
    : decode_([&tok](const std::vector<int32_t>& ids) { return tok.decode(ids); }, prompt), stops_(std::move(stops)) {}

std::string TextStream::emit(std::string s) {
  emitted_ += s;
  return s;
}

std::string TextStream::push_token(int32_t id) {
  if (stopped()) return "";
  return emit(stops_.push(utf8_.push(decode_.push(id))));
}

std::string TextStream::finish() {
  if (stopped()) return "";
  std::string out = stops_.push(utf8_.push(decode_.flush()) + utf8_.flush());
  if (!stopped()) out += stops_.flush();
  return emit(std::move(out));
}

std::string render_completion(const TextTokenizer& tok, const std::vector<int32_t>& tokens,
                              const std::vector<std::string>& stops, bool* stopped, std::span<const int32_t> prompt) {
  TextStream ts(tok, stops, prompt);
  for (int32_t id : tokens) {
    ts.push_token(id);
    if (ts.stopped()) break;
  }
  ts.finish();
  if (stopped) *stopped = ts.stopped();
  return ts.text();
}

}  // namespace loom::serve
