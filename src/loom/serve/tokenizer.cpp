// Byte-level tokenizer and the incremental UTF-8 assembler used for streamed text.
#include "loom/serve/tokenizer.h"

#include "loom/core/error.h"

namespace loom::serve {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(int32_t(c));
  return ids;
}

std::string ByteTokenizer::token_bytes(int32_t id) const {
  LOOM_CHECK(id >= 0 && id < 256, "tokenizer", "byte token id ", id, " is outside [0, 256)");
  return std::string(1, char(uint8_t(id)));
}

namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the character a lead byte starts, or 0 when it cannot start one.
int utf8_length(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Valid range of the byte after `lead` (RFC 3629 section 4 excludes overlongs and surrogates).
bool second_byte_ok(uint8_t lead, uint8_t b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

}  // namespace

std::string Utf8Assembler::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0, n = pending_.size();
  while (i < n) {
    uint8_t lead = uint8_t(pending_[i]);
    int len = utf8_length(lead);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    int good = 1;  // bytes of this character seen so far that are valid
    while (good < len && i + good < n) {
      uint8_t b = uint8_t(pending_[i + good]);
      bool ok = good == 1 ? second_byte_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++good;
    }
    if (good == len) {
      out.append(pending_, i, len);
      i += len;
    } else if (i + good == n) {
      break;  // unfinished character: wait for more bytes
    } else {
      out += kReplacement;  // the maximal valid prefix is replaced once
      i += good;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Assembler::flush() {
  std::string out = pending_.empty() ? "" : kReplacement;
  pending_.clear();
  return out;
}

std::string decode_tokens(const TextTokenizer& tok, const std::vector<int32_t>& ids) {
  Utf8Assembler utf8;
  std::string text;
  for (int32_t id : ids) text += utf8.push(tok.token_bytes(id));
  return text + utf8.flush();
}

}  // namespace loom::serve
