// The server's view of loom::data tokenizers and the incremental UTF-8 assembler.
#include "loom/serve/tokenizer.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/data/tokenizer.h"

namespace loom::serve {

DataTokenizer::DataTokenizer(std::unique_ptr<data::Tokenizer> tok, std::vector<int32_t> end_ids)
    : tok_(std::move(tok)) {
  LOOM_CHECK(tok_ != nullptr, "tokenizer", "no tokenizer given");
  if (const auto eos = tok_->eos_id()) end_ids_.push_back(*eos);
  for (int32_t id : end_ids) {
    LOOM_CHECK(id >= 0 && id < tok_->vocab_size(), "tokenizer", "end token id ", id, " is outside the ", tok_->name(),
               " vocabulary [0, ", tok_->vocab_size(), ")");
    if (std::find(end_ids_.begin(), end_ids_.end(), id) == end_ids_.end()) end_ids_.push_back(id);
  }
}

DataTokenizer::~DataTokenizer() = default;

std::vector<int32_t> DataTokenizer::encode(std::string_view text) const { return tok_->encode(text); }

std::vector<int32_t> DataTokenizer::encode_special(std::string_view text) const { return tok_->encode_special(text); }

std::string DataTokenizer::token_bytes(int32_t id) const {
  LOOM_CHECK(id >= 0 && id < tok_->vocab_size(), "tokenizer", "token id ", id, " is outside the ", tok_->name(),
             " vocabulary [0, ", tok_->vocab_size(), ")");
  if (tok_->is_special(id)) return "";
  return tok_->decode(std::span<const int32_t>(&id, 1));
}

std::string DataTokenizer::decode(std::span<const int32_t> ids) const { return tok_->decode_skip_special(ids); }

int64_t DataTokenizer::vocab_size() const { return tok_->vocab_size(); }

int32_t DataTokenizer::eos_token() const { return tok_->eos_id().value_or(-1); }

std::string DataTokenizer::name() const { return tok_->name(); }

ByteTextTokenizer::ByteTextTokenizer() : DataTokenizer(std::make_unique<data::ByteTokenizer>()) {}

std::unique_ptr<DataTokenizer> make_text_tokenizer(const std::string& name, const std::string& data_dir,
                                                   const std::vector<int32_t>& end_ids) {
  return std::make_unique<DataTokenizer>(data::make_tokenizer(name, data_dir), end_ids);
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

}  // namespace loom::serve
