// Shard mapping, validation (header at open, then one pass over the payload for its checksum,
// token range and mask bits) and the batch walks (seeded random windows or conversations,
// sequential eval), with the loss mask turned into ignored targets.
#include "loom/data/dataset.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "loom/core/error.h"
#include "loom/core/rng.h"
#include "loom/core/timer.h"

namespace loom::data {

namespace {

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

template <class T>
T load(const unsigned char* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// The largest of n ids of type T at p (a loop the compiler vectorises).
template <class T>
uint32_t max_id(const unsigned char* p, size_t n) {
  T m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, load<T>(p, i));
  return uint32_t(m);
}

// Index of the first of n ids of type T at p that is >= limit; n if none.
template <class T>
size_t first_at_least(const unsigned char* p, size_t n, uint32_t limit) {
  for (size_t i = 0; i < n; ++i)
    if (uint32_t(load<T>(p, i)) >= limit) return i;
  return n;
}

// Whether the loss counts a target token with mask byte m (a row never runs from one
// conversation into another, so a target is always in its input's conversation).
bool trains(uint8_t m) { return (m & kMaskTrained) != 0; }

}  // namespace

TokenDataset::TokenDataset(const std::string& path, const DatasetOptions& opt)
    : file_(io::MappedFile::open(path, "data",
                                 "run loom prepare --input FILE --out DIR first and point the loader at DIR")),
      seed_(opt.seed),
      layout_(opt.layout) {
  header_ = parse_shard_header(file_->data(), file_->size(), label());
  if (opt.model_vocab > 0) check_vocab(opt.model_vocab);
  if (opt.verify) verify(opt.log, opt.log_after_s);
  index_conversations();
  LOOM_CHECK(layout_ != ChatLayout::pad || has_mask(), "data", label(),
             " holds plain text (no loss mask), but the pad layout (data.chat_layout=pad) puts one conversation "
             "in each row; prepare conversations with loom prepare --chat, or use data.chat_layout=pack");
}

const unsigned char* TokenDataset::mask_bytes() const {
  return file_->data() + kShardHeaderBytes + header_.n_tokens * header_.token_bytes;
}

void TokenDataset::index_conversations() {
  if (!has_mask()) return;
  const unsigned char* m = mask_bytes();
  for (int64_t i = 0; i < size(); ++i)
    if (m[i] & kMaskConversationStart) starts_.push_back(i);
  LOOM_CHECK(size() == 0 || (!starts_.empty() && starts_[0] == 0), "data", label(),
             ": its first token does not start a conversation (mask byte ", int(m[0]), " at byte offset ",
             mask_bytes() - file_->data(), "); re-run loom prepare to rebuild it");
}

void TokenDataset::read_mask(int64_t first, int64_t n, uint8_t* out) const {
  LOOM_CHECK(first >= 0 && n >= 0 && first + n <= size(), "data", label(), ": mask of tokens [", first, ", ", first + n,
             ") is outside its ", size(), " tokens");
  if (!has_mask()) {
    std::fill(out, out + n, kMaskTrained);
    return;
  }
  std::memcpy(out, mask_bytes() + first, size_t(n));
}

int64_t TokenDataset::conversation_length(int64_t c) const {
  const int64_t n = int64_t(starts_.size());
  LOOM_CHECK(c >= 0 && c < n, "data", label(), ": conversation ", c, " is outside its ", n);
  return (c + 1 < n ? starts_[size_t(c + 1)] : size()) - starts_[size_t(c)];
}

int64_t TokenDataset::conversations_longer_than(int64_t n) const {
  int64_t count = 0;
  for (int64_t c = 0; c < int64_t(starts_.size()); ++c) count += conversation_length(c) > n;
  return count;
}

TokenDataset TokenDataset::open_split(const std::string& dir, const std::string& split, const DatasetOptions& opt) {
  return TokenDataset((std::filesystem::path(dir) / (split + ".bin")).string(), opt);
}

// The path as the caller gave it (DIR/train.bin), so that a message tells which run's data.
std::string TokenDataset::label() const { return file_->path(); }

int32_t TokenDataset::token(int64_t i) const {
  const unsigned char* p = file_->data() + kShardHeaderBytes;
  return header_.token_bytes == 2 ? int32_t(load<uint16_t>(p, size_t(i))) : int32_t(load<uint32_t>(p, size_t(i)));
}

void TokenDataset::read(int64_t first, int64_t n, int32_t* out) const {
  LOOM_CHECK(first >= 0 && n >= 0 && first + n <= size(), "data", label(), ": read of tokens [", first, ", ", first + n,
             ") (bytes ", byte_offset(first), "..", byte_offset(first + n), ") is outside its ", size(), " tokens");
  const unsigned char* p = file_->data() + byte_offset(first);
  uint32_t largest = 0;
  if (header_.token_bytes == 2) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t v = load<uint16_t>(p, size_t(i));
      largest = std::max<uint32_t>(largest, v);
      out[i] = int32_t(v);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t v = load<uint32_t>(p, size_t(i));
      largest = std::max(largest, v);
      out[i] = int32_t(v);
    }
  }
  // Verified at open, so this fires only if the file was opened with verify off or was
  // rewritten in place since; either way it must not reach the model as an id.
  if (largest >= header_.vocab_size) {
    const int64_t i = std::find_if(out, out + n, [&](int32_t t) { return uint32_t(t) >= header_.vocab_size; }) - out;
    fail_bad_id(first + i, uint32_t(out[i]),
                "the file was opened without verification or changed on disk since; re-run loom prepare to "
                "rebuild it");
  }
}

int64_t TokenDataset::byte_offset(int64_t token_index) const {
  return int64_t(kShardHeaderBytes) + token_index * int64_t(header_.token_bytes);
}

void TokenDataset::fail_bad_id(int64_t index, uint32_t id, const char* fix) const {
  fail("data", label(), ": token id ", id, " at token ", index, " (byte offset ", byte_offset(index),
       ") is outside the vocabulary of ", header_.vocab_size, " (header vocab_size); ", fix);
}

void TokenDataset::verify(std::FILE* log, double log_after_s) const {
  // FNV-1a is one dependent multiply per byte, so the pass runs at hash speed (docs/DATA.md);
  // each chunk's id range (or mask bits) is checked while it is still in cache.
  constexpr size_t kChunkBytes = size_t(1) << 20;
  const unsigned char* payload = file_->data() + kShardHeaderBytes;
  const uint32_t tb = header_.token_bytes;
  const size_t token_total = size_t(header_.n_tokens) * tb, total = size_t(header_.payload_bytes());
  uint64_t sum = kFnvOffset;
  int64_t bad_index = -1, bad_mask = -1;
  Stopwatch clock;
  bool announced = false;
  // Hashes payload bytes [from, to) chunk by chunk, handing each chunk to `check`.
  auto pass = [&](size_t from, size_t to, auto&& check) {
    for (size_t done = from; done < to; done += kChunkBytes) {
      if (log && !announced && clock.seconds() >= log_after_s) {
        std::fprintf(log, "[data] verifying %s: payload checksum and token ids of %" PRIu64 " tokens (%.1f MB)...\n",
                     label().c_str(), header_.n_tokens, double(total) / 1e6);
        std::fflush(log);
        announced = true;
      }
      const size_t bytes = std::min(kChunkBytes, to - done);
      sum = fnv1a64(payload + done, bytes, sum);
      check(payload + done, done - from, bytes);
    }
  };
  pass(0, token_total, [&](const unsigned char* p, size_t at, size_t bytes) {
    if (bad_index >= 0) return;
    const size_t n = bytes / tb;
    const uint32_t largest = tb == 2 ? max_id<uint16_t>(p, n) : max_id<uint32_t>(p, n);
    if (largest >= header_.vocab_size)
      bad_index = int64_t(at / tb) + int64_t(tb == 2 ? first_at_least<uint16_t>(p, n, header_.vocab_size)
                                                     : first_at_least<uint32_t>(p, n, header_.vocab_size));
  });
  pass(token_total, total, [&](const unsigned char* p, size_t at, size_t bytes) {
    if (bad_mask >= 0) return;
    for (size_t i = 0; i < bytes; ++i)
      if (p[i] & ~kMaskKnownBits) {
        bad_mask = int64_t(at + i);
        return;
      }
  });
  if (announced) {
    const double s = clock.seconds();
    std::fprintf(log, "[data] verified %s in %.1f s (%.0f MB/s)\n", label().c_str(), s, double(total) / 1e6 / s);
    std::fflush(log);
  }
  if (sum != header_.checksum) {
    std::string also;
    if (bad_index >= 0)
      also = str_cat("; among the damage, token id ", uint32_t(token(bad_index)), " at token ", bad_index,
                     " (byte offset ", byte_offset(bad_index), ") is outside the vocabulary of ", header_.vocab_size);
    fail("data", label(), ": payload checksum ", hex64(sum), " (FNV-1a 64 of the ", total, " bytes from offset ",
         kShardHeaderBytes, ") differs from the header's ", hex64(header_.checksum), also,
         "; the file is corrupted; re-run loom prepare to rebuild it");
  }
  if (bad_index >= 0)
    fail_bad_id(bad_index, uint32_t(token(bad_index)),
                "its checksum matches, so it was written that way (not by loom prepare, or by one with another "
                "vocabulary); re-run loom prepare to rebuild it");
  if (bad_mask >= 0)
    fail("data", label(), ": mask byte ", int(mask_bytes()[bad_mask]), " of token ", bad_mask, " (byte offset ",
         mask_bytes() - file_->data() + bad_mask, ") has bits other than trained (1) and conversation start (2); ",
         "re-run loom prepare to rebuild it");
}

void TokenDataset::check_vocab(int64_t model_vocab) const {
  const int64_t v = header_.vocab_size;
  const int64_t padded_max = (v + 1023) / 1024 * 1024;
  if (model_vocab >= v && model_vocab <= padded_max) return;
  std::string fix;
  if (model_vocab >= 50257 && model_vocab <= 51200) {
    fix = "re-run loom prepare with --tokenizer gpt2";
  } else if (model_vocab >= 256 && model_vocab <= 1024) {
    fix = "re-run loom prepare with --tokenizer byte";
  } else {
    fix = str_cat("re-run loom prepare with a tokenizer of ", model_vocab, " tokens or set the model's vocab_size to ",
                  v);
  }
  fail("data", label(), " has vocab_size ", v, " (tokenizer ", header_.tokenizer, ") but the model has ", model_vocab,
       "; ", fix);
}

void TokenDataset::check_window(int64_t T, const char* what) const {
  LOOM_CHECK(T > 0, "data", label(), ": ", what, " sequence length T must be positive, got ", T);
  if (layout_ == ChatLayout::pad || packs_documents()) {
    LOOM_CHECK(!starts_.empty(), "data", label(), " holds no conversations");
    return;
  }
  LOOM_CHECK(size() >= T + 1, "data", label(), " has ", size(), " tokens, fewer than one ", what,
             " window of T+1 = ", T + 1, "; use a shorter sequence length or more text");
}

namespace {
// Row `seq` of the global batch at `step` -> uniform in [0, n), from Philox keyed (seed,
// hash_name("loader"), step * global_batch + seq). Multiply-shift maps 64 random bits onto
// [0, n); the bias is below n / 2^64.
int64_t draw_row(uint64_t seed, int64_t step, int64_t seq, int64_t global_batch, uint64_t n) {
  CounterRng rng(seed, hash_name("loader"));
  rng.set_position(uint64_t(step) * uint64_t(global_batch) + uint64_t(seq));
  return int64_t((static_cast<unsigned __int128>(rng.next_u64()) * n) >> 64);
}
}  // namespace

int64_t TokenDataset::window_start(int64_t step, int64_t seq, int64_t global_batch, int64_t T) const {
  if (layout_ == ChatLayout::pad) return starts_[size_t(draw_row(seed_, step, seq, global_batch, starts_.size()))];
  if (packs_documents()) {
    const std::vector<int64_t>& bins = bins_for(T);
    return starts_[size_t(bins[size_t(draw_row(seed_, step, seq, global_batch, bins.size() - 1))])];
  }
  return draw_row(seed_, step, seq, global_batch, uint64_t(size() - T));  // offsets 0 .. size-T-1 fit T+1
}

void TokenDataset::copy_window(int64_t start, int64_t T, int32_t* tokens, int32_t* targets) const {
  read(start, T, tokens);  // plain text: every target trains
  read(start + 1, T, targets);
}

int32_t TokenDataset::pad_id() const { return header_.eot_id == kNoEot ? 0 : int32_t(header_.eot_id); }

int64_t TokenDataset::copy_conversation_part(int64_t c, int64_t T, int32_t* tokens, int32_t* targets) const {
  const int64_t start = starts_[size_t(c)], len = conversation_length(c);
  const int64_t n_in = std::min(T, len), n_out = std::min(T, len - 1);
  read(start, n_in, tokens);
  read(start + 1, n_out, targets);
  const unsigned char* m = mask_bytes() + start + 1;
  for (int64_t t = 0; t < n_out; ++t)
    if (!trains(m[t])) targets[t] = kIgnoredTarget;
  std::fill(targets + n_out, targets + n_in, kIgnoredTarget);
  return n_in;
}

void TokenDataset::copy_conversation(int64_t c, int64_t T, int32_t* tokens, int32_t* targets) const {
  const int64_t n = copy_conversation_part(c, T, tokens, targets);
  // Padding only feeds positions after the conversation, whose targets are ignored (causal
  // attention keeps it out of the conversation's own positions).
  std::fill(tokens + n, tokens + T, pad_id());
  std::fill(targets + n, targets + T, kIgnoredTarget);
}

std::vector<int64_t> TokenDataset::bins(int64_t T) const {
  std::vector<int64_t> out;
  const int64_t n = int64_t(starts_.size());
  int64_t used = 0;
  for (int64_t c = 0; c < n; ++c) {
    const int64_t len = conversation_length(c);
    if (out.empty() || used + len > T) {  // a new bin (a conversation longer than T fills one alone)
      out.push_back(c);
      used = 0;
    }
    used += len;
  }
  out.push_back(n);
  return out;
}

const std::vector<int64_t>& TokenDataset::bins_for(int64_t T) const {
  if (bins_T_ != T) {
    bins_ = bins(T);
    bins_T_ = T;
  }
  return bins_;
}

void TokenDataset::copy_bin(int64_t b, int64_t T, int32_t* tokens, int32_t* targets, int32_t* positions) const {
  const std::vector<int64_t>& bins = bins_for(T);
  int64_t at = 0;
  for (int64_t c = bins[size_t(b)]; c < bins[size_t(b) + 1] && at < T; ++c) {
    const int64_t n = copy_conversation_part(c, T - at, tokens + at, targets + at);
    if (positions)
      for (int64_t t = 0; t < n; ++t) positions[at + t] = int32_t(t);
    at += n;
  }
  // Padding after the last conversation: ignored targets, positions counting on from it.
  std::fill(tokens + at, tokens + T, pad_id());
  std::fill(targets + at, targets + T, kIgnoredTarget);
  if (positions)
    for (int64_t t = at; t < T; ++t) positions[t] = t == 0 ? 0 : positions[t - 1] + 1;
}

void TokenDataset::fill_batch(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t global_batch, int64_t T,
                              int32_t* tokens, int32_t* targets, int32_t* positions) const {
  check_window(T, "training");
  LOOM_CHECK(step >= 0 && first_seq >= 0 && n_seqs >= 0 && first_seq + n_seqs <= global_batch, "data", label(),
             ": training sequences [", first_seq, ", ", first_seq + n_seqs, ") at step ", step,
             " are outside the global batch of ", global_batch);
  for (int64_t r = 0; r < n_seqs; ++r) {
    if (packs_documents()) {
      const uint64_t n = bins_for(T).size() - 1;
      copy_bin(int64_t(draw_row(seed_, step, first_seq + r, global_batch, n)), T, tokens + r * T, targets + r * T,
               positions ? positions + r * T : nullptr);
      continue;
    }
    if (layout_ == ChatLayout::pad) {
      const uint64_t n = starts_.size();
      copy_conversation(draw_row(seed_, step, first_seq + r, global_batch, n), T, tokens + r * T, targets + r * T);
    } else {
      copy_window(window_start(step, first_seq + r, global_batch, T), T, tokens + r * T, targets + r * T);
    }
    if (positions) std::iota(positions + r * T, positions + (r + 1) * T, 0);
  }
}

int64_t TokenDataset::eval_windows(int64_t T) const {
  check_window(T, "validation");
  if (packs_documents()) return int64_t(bins_for(T).size()) - 1;
  return layout_ == ChatLayout::pad ? int64_t(starts_.size()) : (size() - 1) / T;
}

void TokenDataset::fill_eval_batch(int64_t index, int64_t B, int64_t T, int32_t* tokens, int32_t* targets,
                                   int32_t* positions) const {
  const int64_t n_windows = eval_windows(T);
  LOOM_CHECK(index >= 0 && B > 0, "data", label(), ": eval batch index ", index, " and batch size ", B,
             " must be non-negative and positive");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t w = (index * B + b) % n_windows;
    if (packs_documents()) {
      copy_bin(w, T, tokens + b * T, targets + b * T, positions ? positions + b * T : nullptr);
      continue;
    }
    if (layout_ == ChatLayout::pad)
      copy_conversation(w, T, tokens + b * T, targets + b * T);
    else
      copy_window(w * T, T, tokens + b * T, targets + b * T);
    if (positions) std::iota(positions + b * T, positions + (b + 1) * T, 0);
  }
}

}  // namespace loom::data
