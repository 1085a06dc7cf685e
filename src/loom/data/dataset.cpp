// Shard mapping, validation and the two batch walks (seeded random windows, sequential eval).
#include "loom/data/dataset.h"

#include <cstring>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/rng.h"

namespace loom::data {

TokenDataset::TokenDataset(const std::string& path, const DatasetOptions& opt)
    : file_(io::MappedFile::open(path, "data",
                                 "run loom prepare --input FILE --out DIR first and point the loader at DIR")),
      seed_(opt.seed) {
  header_ = parse_shard_header(file_->data(), file_->size(), label());
  if (opt.model_vocab > 0) check_vocab(opt.model_vocab);
  if (opt.verify) verify();
}

TokenDataset TokenDataset::open_split(const std::string& dir, const std::string& split,
                                      const DatasetOptions& opt) {
  return TokenDataset((std::filesystem::path(dir) / (split + ".bin")).string(), opt);
}

std::string TokenDataset::label() const { return std::filesystem::path(file_->path()).filename().string(); }

int32_t TokenDataset::token(int64_t i) const {
  const unsigned char* p = file_->data() + kShardHeaderBytes;
  if (header_.token_bytes == 2) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    return int32_t(v);
  }
  uint32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return int32_t(v);
}

void TokenDataset::read(int64_t first, int64_t n, int32_t* out) const {
  LOOM_CHECK(first >= 0 && n >= 0 && first + n <= size(), "data", "read of tokens [", first, ", ", first + n,
             ") is outside ", label(), " (", size(), " tokens)");
  const unsigned char* p = file_->data() + kShardHeaderBytes;
  if (header_.token_bytes == 2) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * (first + i), 2);
      out[i] = int32_t(v);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, p + 4 * (first + i), 4);
      out[i] = int32_t(v);
    }
  }
}

void TokenDataset::verify() const {
  const unsigned char* p = file_->data() + kShardHeaderBytes;
  const uint64_t sum = fnv1a64(p, header_.n_tokens * header_.token_bytes);
  LOOM_CHECK(sum == header_.checksum, "data", label(), " is corrupt: payload checksum ", sum,
             " does not match the header's ", header_.checksum, "; re-run loom prepare to rebuild it");
  for (int64_t i = 0; i < size(); ++i) {
    const int32_t t = token(i);
    LOOM_CHECK(uint32_t(t) < header_.vocab_size, "data", label(), " token ", i, " is ", t,
               ", outside its vocab_size ", header_.vocab_size, "; re-run loom prepare to rebuild it");
  }
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
    fix = str_cat("re-run loom prepare with a tokenizer of ", model_vocab,
                  " tokens or set the model's vocab_size to ", v);
  }
  fail("data", label(), " has vocab_size ", v, " (tokenizer ", header_.tokenizer, ") but the model has ",
       model_vocab, "; ", fix);
}

void TokenDataset::check_window(int64_t T, const char* what) const {
  LOOM_CHECK(T > 0, "data", what, ": sequence length T must be positive, got ", T);
  LOOM_CHECK(size() >= T + 1, "data", label(), " has ", size(), " tokens, fewer than one ", what,
             " window of T+1 = ", T + 1, "; use a shorter sequence length or more text");
}

int64_t TokenDataset::window_start(int64_t step, int64_t seq, int64_t global_batch, int64_t T) const {
  const uint64_t n_starts = uint64_t(size() - T);  // offsets 0 .. size-T-1 all fit T+1 tokens
  CounterRng rng(seed_, hash_name("loader"));
  rng.set_position(uint64_t(step) * uint64_t(global_batch) + uint64_t(seq));
  // Multiply-shift maps 64 random bits onto [0, n_starts); the bias is below n_starts / 2^64.
  return int64_t((static_cast<unsigned __int128>(rng.next_u64()) * n_starts) >> 64);
}

void TokenDataset::copy_window(int64_t start, int64_t T, int32_t* tokens, int32_t* targets) const {
  read(start, T, tokens);
  read(start + 1, T, targets);
}

void TokenDataset::fill_batch(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t global_batch, int64_t T,
                              int32_t* tokens, int32_t* targets) const {
  check_window(T, "training");
  LOOM_CHECK(step >= 0 && first_seq >= 0 && n_seqs >= 0 && first_seq + n_seqs <= global_batch, "data",
             "sequences [", first_seq, ", ", first_seq + n_seqs, ") at step ", step,
             " are outside the global batch of ", global_batch);
  for (int64_t r = 0; r < n_seqs; ++r)
    copy_window(window_start(step, first_seq + r, global_batch, T), T, tokens + r * T, targets + r * T);
}

int64_t TokenDataset::eval_windows(int64_t T) const {
  check_window(T, "validation");
  return (size() - 1) / T;
}

void TokenDataset::fill_eval_batch(int64_t index, int64_t B, int64_t T, int32_t* tokens, int32_t* targets) const {
  const int64_t n_windows = eval_windows(T);
  LOOM_CHECK(index >= 0 && B > 0, "data", "eval batch index ", index, " and batch size ", B,
             " must be non-negative and positive");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t w = (index * B + b) % n_windows;
    copy_window(w * T, T, tokens + b * T, targets + b * T);
  }
}

}  // namespace loom::data
