// TokenDataset: one memory-mapped token shard and the batches drawn from it. Training
// windows start at offsets that are a pure function of (seed, step, sequence index in the
// global batch), so any split of a global batch over ranks and micro-batches, and any restart
// at step k, sees exactly the tokens a single process would. Validation walks in order.
// A shard with a loss mask (conversations) gives kIgnoredTarget for every target the mask
// does not train, laid out per ChatLayout.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/shard_format.h"
#include "loom/io/file.h"

namespace loom::data {

// A target the loss skips (model/decoder.h ignores targets < 0).
inline constexpr int32_t kIgnoredTarget = -1;

// How a shard of conversations becomes training rows of T tokens (data.chat_layout).
enum class ChatLayout {
  // Whole conversations packed into rows: consecutive conversations of the shard fill a row
  // (a bin) while they fit in its T tokens, the rest padded; each attends only to itself
  // (positions restart where each starts). A conversation longer than T has a row of its own,
  // cut as in pad. A shard of plain text ignores the layout (windows anywhere).
  pack,
  // Each row is one conversation from its first token, cut after T + 1 tokens; the rest of the
  // row is padding (the end-of-text id, else 0) with ignored targets.
  pad,
};

struct DatasetOptions {
  int64_t model_vocab = -1;  // > 0: check the shard against the model's vocabulary on open
  uint64_t seed = 0;         // seeds the training windows
  bool verify = true;        // check the payload checksum and every token id on open (one pass)
  std::FILE* log = nullptr;  // where a verification that takes log_after_s or more says so
  double log_after_s = 1.0;
  ChatLayout layout = ChatLayout::pack;  // pad needs a shard with a mask
};

class TokenDataset {
 public:
  // Maps `path`, validates its header and (unless opt.verify is false) its payload; every
  // error names the file, and the token and byte offset where there is one.
  explicit TokenDataset(const std::string& path, const DatasetOptions& opt = {});
  // <dir>/<split>.bin, e.g. open_split("out/shakespeare", "train").
  static TokenDataset open_split(const std::string& dir, const std::string& split, const DatasetOptions& opt = {});

  const ShardHeader& header() const { return header_; }
  const std::string& path() const { return file_->path(); }
  int64_t size() const { return int64_t(header_.n_tokens); }
  int32_t token(int64_t i) const;
  // Copies tokens [first, first + n) as int32.
  void read(int64_t first, int64_t n, int32_t* out) const;

  // The loss mask (kMaskTrained, kMaskConversationStart per token). A shard without one trains
  // every token and is one document: read_mask gives kMaskTrained for each.
  bool has_mask() const { return header_.has_mask(); }
  void read_mask(int64_t first, int64_t n, uint8_t* out) const;
  // Where each conversation starts (empty without a mask); conversation c ends where c + 1
  // starts, the last at size().
  const std::vector<int64_t>& conversation_starts() const { return starts_; }
  int64_t conversation_length(int64_t c) const;
  // Conversations of more than n tokens (those the pad layout cuts at n = T + 1).
  int64_t conversations_longer_than(int64_t n) const;

  // One pass over the payload: recomputes its FNV-1a 64 against the header's and checks every
  // id < vocab_size and every mask byte's bits. A checksum mismatch is reported first (it
  // explains a bad id too). When `log` is set and the pass reaches `log_after_s` seconds, it
  // logs a line when it gets there and one when it is done.
  void verify(std::FILE* log = nullptr, double log_after_s = 1.0) const;
  // Throws "[data] DIR/train.bin has vocab_size 256 but the model has 50257; ..." unless the
  // model's vocabulary covers the shard's (models may pad theirs up to a multiple of 64..1024).
  void check_vocab(int64_t model_vocab) const;

  // Start of training window `seq` of the global batch at `step`: uniform over every offset
  // whose T+1 tokens fit, from Philox keyed (seed, hash_name("loader"), step*global_batch+seq).
  // With conversations, the first token of the row's conversation (pad) or of its bin's first
  // conversation (pack), the conversation or bin drawn the same way.
  int64_t window_start(int64_t step, int64_t seq, int64_t global_batch, int64_t T) const;
  // The pack layout's bins for rows of T tokens: bin b holds conversations [bins[b],
  // bins[b + 1]) (the last entry is the number of conversations).
  std::vector<int64_t> bins(int64_t T) const;
  // Rows [first_seq, first_seq + n_seqs) of the global batch at `step`: tokens[r*T + t] is
  // the window's t-th token and targets[r*T + t] the (t+1)-th, or kIgnoredTarget where the
  // mask does not train that (t+1)-th token. Rank r of W data-parallel ranks passes
  // first_seq = r * global_batch / W. positions (optional): each token's position in its
  // conversation (t, where a row is one document; see packs_documents).
  void fill_batch(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t global_batch, int64_t T, int32_t* tokens,
                  int32_t* targets, int32_t* positions = nullptr) const;
  // Whether rows hold several conversations (the pack layout of a shard with a mask), whose
  // positions fill_batch gives so that each attends only to itself.
  bool packs_documents() const { return has_mask() && layout_ == ChatLayout::pack; }

  // Validation: non-overlapping windows start at 0, T, 2T, ... (pad: one per conversation, pack:
  // one per bin, in order); batch `index` takes windows index*B .. index*B + B - 1, wrapping
  // around after the last.
  int64_t eval_windows(int64_t T) const;
  void fill_eval_batch(int64_t index, int64_t B, int64_t T, int32_t* tokens, int32_t* targets,
                       int32_t* positions = nullptr) const;

 private:
  std::string label() const;
  int64_t byte_offset(int64_t token_index) const;
  [[noreturn]] void fail_bad_id(int64_t index, uint32_t id, const char* fix) const;
  void check_window(int64_t T, const char* what) const;
  void copy_window(int64_t start, int64_t T, int32_t* tokens, int32_t* targets) const;
  // Conversation c's first n <= T tokens at row[0, n) and their targets (ignored past its end and
  // where the mask does not train); returns n.
  int64_t copy_conversation_part(int64_t c, int64_t T, int32_t* tokens, int32_t* targets) const;
  void copy_conversation(int64_t c, int64_t T, int32_t* tokens, int32_t* targets) const;
  void copy_bin(int64_t b, int64_t T, int32_t* tokens, int32_t* targets, int32_t* positions) const;
  const std::vector<int64_t>& bins_for(int64_t T) const;  // cached bins(T)
  int32_t pad_id() const;
  void index_conversations();
  const unsigned char* mask_bytes() const;

  std::shared_ptr<const io::MappedFile> file_;
  ShardHeader header_;
  uint64_t seed_ = 0;
  ChatLayout layout_ = ChatLayout::pack;
  std::vector<int64_t> starts_;  // conversation starts (shards with a mask)
  mutable int64_t bins_T_ = -1;  // the pack layout's bins for rows of bins_T_ tokens
  mutable std::vector<int64_t> bins_;
};

}  // namespace loom::data
