// Runs a PipelineSpec the way tokenizers' TokenizerImpl::encode does: added tokens that match
// the raw text are cut out first, each remaining piece is normalized, added tokens that match
// normalized text are cut out, then pre-tokenized words go through the BPE model. Decoding
// runs the decoder steps over the tokens' strings, with per-id results precomputed for the
// leading steps that see one token at a time.
#include "loom/data/pipeline_tokenizer.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom::data {
namespace {

bool fuses(DecodeStep::Kind k) { return k == DecodeStep::Kind::kByteLevel || k == DecodeStep::Kind::kFuse; }

// Length of the UTF-8 character ending at s.size() (1 for an ill-formed byte).
size_t last_char_len(const std::string& s) {
  size_t n = 1;
  while (n < s.size() && n < 4 && (uint8_t(s[s.size() - n]) & 0xC0) == 0x80) ++n;
  return (uint8_t(s[s.size() - n]) & 0xC0) == 0x80 ? 1 : n;
}

void apply_step(const DecodeStep& step, std::vector<std::string>& toks) {
  using K = DecodeStep::Kind;
  switch (step.kind) {
    case K::kByteLevel: {
      std::string all, raw;
      for (const std::string& t : toks) all += byte_level_unmap(t, &raw) ? raw : t;
      toks.assign(1, std::move(all));
      return;
    }
    case K::kFuse: {
      std::string all;
      for (const std::string& t : toks) all += t;
      toks.assign(1, std::move(all));
      return;
    }
    case K::kByteFallback:
      for (std::string& t : toks) {
        if (const auto b = byte_fallback_value(t)) t = std::string(1, char(*b));
      }
      return;
    case K::kReplace:
      for (std::string& t : toks) t = replace_all(t, step.pattern, step.content);
      return;
    case K::kMetaspace:
      for (size_t i = 0; i < toks.size(); ++i)
        toks[i] = replace_all(toks[i], step.content, i == 0 && step.prepend ? "" : " ");
      return;
    case K::kStrip:
      for (std::string& t : toks) {
        size_t cut = 0;
        for (size_t k = 0; k < step.start && t.compare(cut, step.content.size(), step.content) == 0; ++k)
          cut += step.content.size();
        t.erase(0, cut);
        for (size_t k = 0; k < step.stop && !t.empty(); ++k) {
          const size_t n = last_char_len(t);
          if (t.compare(t.size() - n, n, step.content) != 0) break;
          t.resize(t.size() - n);
        }
      }
      return;
  }
}

}  // namespace

PipelineTokenizer::PipelineTokenizer(PipelineSpec spec) : spec_(std::move(spec)) {
  LOOM_CHECK(spec_.model != nullptr, "tokenizer", spec_.name, ": no model");
  vocab_size_ = spec_.model->size();
  for (const AddedToken& t : spec_.added) vocab_size_ = std::max(vocab_size_, t.id + 1);
  const size_t n = size_t(vocab_size_);
  added_text_.assign(n, std::string());
  decoder_input_.assign(n, std::string());
  is_added_.assign(n, false);
  special_.assign(n, false);
  for (int32_t id = 0; id < spec_.model->size(); ++id) decoder_input_[size_t(id)] = spec_.model->token(id);

  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_text, normalized_text;
  for (const AddedToken& t : spec_.added) {
    LOOM_CHECK(t.id >= 0, "tokenizer", spec_.name, ": added token '", t.content, "' has a negative id");
    const size_t id = size_t(t.id);
    added_text_[id] = t.content;
    is_added_[id] = true;
    special_[id] = t.special;
    if (t.normalized && !spec_.normalizer.empty()) {
      normalized.push_back(t);
      normalized_text.push_back(spec_.normalizer.apply(t.content));
      decoder_input_[id] = normalized_text.back();
    } else {
      (t.normalized ? normalized : raw).push_back(t);
      (t.normalized ? normalized_text : raw_text).push_back(t.content);
      decoder_input_[id] = t.content;
    }
  }
  for (int32_t id : spec_.control_ids)
    if (id >= 0 && id < vocab_size_) special_[size_t(id)] = true;
  raw_matcher_ = AddedTokenMatcher(std::move(raw), std::move(raw_text));
  normalized_matcher_ = AddedTokenMatcher(std::move(normalized), std::move(normalized_text));

  while (pure_steps_ < spec_.decoder.size() && spec_.decoder[pure_steps_].kind != DecodeStep::Kind::kMetaspace) {
    if (fuses(spec_.decoder[pure_steps_++].kind)) break;
  }
  pure_bytes_.resize(n);
  std::vector<std::string> one(1);
  for (size_t id = 0; id < n; ++id) {
    one.assign(1, decoder_input_[id]);
    for (size_t s = 0; s < pure_steps_; ++s) apply_step(spec_.decoder[s], one);
    pure_bytes_[id] = std::move(one[0]);
  }
}

PipelineTokenizer::~PipelineTokenizer() = default;

bool PipelineTokenizer::add_bos() const { return !spec_.prefix_ids.empty(); }
bool PipelineTokenizer::add_eos() const { return !spec_.suffix_ids.empty(); }

bool PipelineTokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size_ && special_[size_t(id)]; }

void PipelineTokenizer::check_id(int32_t id, size_t position) const {
  LOOM_CHECK(id >= 0 && id < vocab_size_, "tokenizer", "id ", id, " at position ", position, " is outside ", spec_.name,
             "'s vocabulary (0..", vocab_size_ - 1, ")");
}

std::string PipelineTokenizer::token_text(int32_t id) const {
  check_id(id, 0);
  if (is_added_[size_t(id)]) return added_text_[size_t(id)];
  return id < spec_.model->size() ? spec_.model->token(id) : std::string();
}

std::optional<int32_t> PipelineTokenizer::token_id(const std::string& text) const {
  for (const AddedToken& t : spec_.added)
    if (t.content == text) return t.id;
  return spec_.model->find(text);
}

void PipelineTokenizer::encode_append(std::string_view bytes, std::vector<int32_t>& out) const {
  encode_impl(bytes, false, out);
}

void PipelineTokenizer::encode_special_append(std::string_view text, std::vector<int32_t>& out) const {
  encode_impl(text, true, out);
}

void PipelineTokenizer::encode_impl(std::string_view text, bool with_special, std::vector<int32_t>& out) const {
  BpeModel::Scratch scratch;
  PieceArena arena;
  std::vector<std::string_view> words;
  const BpeModel& model = *spec_.model;
  auto encode_piece = [&](std::string_view piece, bool at_start) {
    if (!spec_.pre_tokenizer) {
      model.encode_word(piece, out, scratch);
      return;
    }
    words.clear();
    spec_.pre_tokenizer->split(piece, at_start, words, arena);
    for (std::string_view w : words) model.encode_word(w, out, scratch);
    arena.clear();
  };
  bool first = true;
  raw_matcher_.split(text, with_special, [&](std::string_view piece, std::optional<int32_t> id) {
    const bool at_start = first;
    first = false;
    if (id) {
      out.push_back(*id);
      return;
    }
    if (spec_.normalizer.empty()) {
      normalized_matcher_.split(piece, with_special, [&](std::string_view sub, std::optional<int32_t> sub_id) {
        if (sub_id) {
          out.push_back(*sub_id);
        } else {
          encode_piece(sub, at_start && sub.data() == piece.data());
        }
      });
      return;
    }
    const std::string norm = spec_.normalizer.apply(piece);
    normalized_matcher_.split(norm, with_special, [&](std::string_view sub, std::optional<int32_t> sub_id) {
      if (sub_id) {
        out.push_back(*sub_id);
      } else {
        encode_piece(sub, at_start && sub.data() == norm.data());
      }
    });
  });
}

std::string PipelineTokenizer::decode_impl(std::span<const int32_t> ids, bool skip_special) const {
  for (size_t i = 0; i < ids.size(); ++i) check_id(ids[i], i);
  if (pure_steps_ == spec_.decoder.size() || (pure_steps_ > 0 && fuses(spec_.decoder[pure_steps_ - 1].kind))) {
    std::string all;
    for (int32_t id : ids)
      if (!skip_special || !special_[size_t(id)]) all += pure_bytes_[size_t(id)];
    if (pure_steps_ == spec_.decoder.size()) return all;
    std::vector<std::string> toks(1, std::move(all));
    for (size_t s = pure_steps_; s < spec_.decoder.size(); ++s) apply_step(spec_.decoder[s], toks);
    return toks.empty() ? std::string() : toks[0];
  }
  std::vector<std::string> toks;
  for (int32_t id : ids)
    if (!skip_special || !special_[size_t(id)]) toks.push_back(pure_bytes_[size_t(id)]);
  for (size_t s = pure_steps_; s < spec_.decoder.size(); ++s) apply_step(spec_.decoder[s], toks);
  std::string all;
  for (const std::string& t : toks) all += t;
  return all;
}

std::string PipelineTokenizer::decode(std::span<const int32_t> ids) const { return decode_impl(ids, false); }
std::string PipelineTokenizer::decode_skip_special(std::span<const int32_t> ids) const {
  return decode_impl(ids, true);
}

}  // namespace loom::data
