// libFuzzer target: the GPT-2 tokenizer on arbitrary bytes (ill-formed UTF-8 included):
// decode(encode(x)) == x, every id inside the vocabulary, and the streaming encoder (as
// `loom prepare` drives it, flushing every few tokens) giving the same ids as the whole-text
// one, each flush's tokens decoding to exactly the bytes it reports consumed.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<loom::data::Tokenizer> tok = loom::data::make_tokenizer("gpt2");
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok->encode(text);
  for (int32_t id : ids)
    if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
  if (tok->decode(ids) != text) __builtin_trap();

  // Flushes every 1 to 8 tokens (the first byte decides), so short inputs cross flushes too.
  const size_t flush = size ? 1 + data[0] % 8 : 1;
  std::vector<int32_t> streamed;
  size_t done = 0, calls = 0;
  tok->encode_stream(
      text,
      [&](std::span<const int32_t> part, size_t bytes_done) {
        if (bytes_done < done || bytes_done > size) __builtin_trap();
        streamed.insert(streamed.end(), part.begin(), part.end());
        if (tok->decode(streamed) != text.substr(0, bytes_done)) __builtin_trap();
        done = bytes_done;
        ++calls;
      },
      flush);
  if (calls == 0 || done != size || streamed != ids) __builtin_trap();
  return 0;
}
