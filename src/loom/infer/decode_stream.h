// Token ids arriving one at a time -> the bytes their decoding adds, so that the pieces join
// into the decoding of all the ids at once. Needed because decoders are not per-token
// concatenations: SentencePiece-style ones drop the leading space of the first token they are
// given, so decoding token by token loses every word boundary. Knows nothing of UTF-8 or stop
// strings (serve/text_stream.h and stop_strings.h add them).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace loom::infer {

// The bytes of a token sequence.
using Detokenizer = std::function<std::string(const std::vector<int32_t>&)>;

// Each push decodes a short window that starts at the first token of the last piece returned,
// and returns what it adds to that window's known text (Hugging Face tokenizers' DecodeStream,
// vLLM's incremental detokenizer): the work per token stays the same however long the output.
class DecodeStream {
 public:
  DecodeStream() = default;
  // `context`: tokens the stream continues (a prompt). Its last few tokens are decoded with the
  // first ids so that those read as its continuation; its own text is never returned.
  explicit DecodeStream(Detokenizer decode, std::span<const int32_t> context = {});

  // The bytes decode(context + every id so far) has beyond decode(context + the earlier ids).
  // Empty while the new ids add nothing (a skipped control token) or while the decoder rewrites
  // text already returned; those bytes come with a later id.
  std::string push(int32_t id);
  // At the end: bytes still held because the decoder rewrote earlier text (usually none).
  std::string flush();

 private:
  Detokenizer decode_;
  std::vector<int32_t> window_;  // from the first token of the last piece returned
  size_t returned_ = 0;          // window_[0, returned_): tokens whose text was returned
  std::string returned_text_;    // decode_(window_[0, returned_))
};

}  // namespace loom::infer
