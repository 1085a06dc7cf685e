// Incremental decoding by windows (see decode_stream.h).
#include "loom/infer/decode_stream.h"

#include <algorithm>
#include <utility>

namespace loom::infer {

namespace {
// Context tokens kept before the first id: one is enough for SentencePiece's first-token space,
// a few more keep decoders that look at neighbouring tokens (or skip a control token) honest.
constexpr size_t kContextTokens = 4;
}  // namespace

DecodeStream::DecodeStream(Detokenizer decode, std::span<const int32_t> context) : decode_(std::move(decode)) {
  window_.assign(context.end() - std::min(context.size(), kContextTokens), context.end());
  returned_ = window_.size();
  if (!window_.empty()) returned_text_ = decode_(window_);
}

std::string DecodeStream::push(int32_t id) {
  window_.push_back(id);
  std::string text = decode_(window_);
  if (text.size() <= returned_text_.size() || text.compare(0, returned_text_.size(), returned_text_) != 0) return {};
  std::string piece = text.substr(returned_text_.size());
  // The next window starts at this piece's first token, which gives the next piece its context.
  if (returned_ > 0) {
    window_.erase(window_.begin(), window_.begin() + std::ptrdiff_t(returned_));
    text = decode_(window_);
  }
  returned_ = window_.size();
  returned_text_ = std::move(text);
  return piece;
}

std::string DecodeStream::flush() {
  if (returned_ == window_.size()) return {};
  std::string text = decode_(window_);
  const auto same = std::mismatch(text.begin(), text.end(), returned_text_.begin(), returned_text_.end()).first;
  std::string rest(same, text.end());
  returned_ = window_.size();
  returned_text_ = std::move(text);
  return rest;
}

}  // namespace loom::infer
