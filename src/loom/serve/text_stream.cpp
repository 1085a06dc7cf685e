// Stop-string handling over incrementally decoded text (see text_stream.h).
#include "loom/serve/text_stream.h"

#include <algorithm>

#include "loom/serve/engine_api.h"

namespace loom::serve {

TextStream::TextStream(const TextTokenizer& tok, std::vector<std::string> stops)
    : tok_(tok), stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string TextStream::take(size_t n) {
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  emitted_ += out;
  return out;
}

// Invariant: emitted text never ends in a proper prefix of a stop string, so a stop string
// can only start inside pending_.
std::string TextStream::release() {
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = take(first);
    pending_.clear();
    return out;
  }
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t max_k = std::min(s.size() - 1, pending_.size());
    for (size_t k = max_k; k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  }
  return take(pending_.size() - hold);
}

std::string TextStream::push_token(int32_t id) {
  if (stopped_) return "";
  pending_ += utf8_.push(tok_.token_bytes(id));
  return release();
}

std::string TextStream::finish() {
  if (stopped_) return "";
  pending_ += utf8_.flush();
  std::string out = release();
  if (!stopped_) out += take(pending_.size());
  return out;
}

std::string render_completion(const TextTokenizer& tok, const std::vector<int32_t>& tokens,
                              const std::vector<std::string>& stops, bool* stopped) {
  TextStream ts(tok, stops);
  for (int32_t id : tokens) {
    ts.push_token(id);
    if (ts.stopped()) break;
  }
  ts.finish();
  if (stopped) *stopped = ts.stopped();
  return ts.text();
}

}  // namespace loom::serve
