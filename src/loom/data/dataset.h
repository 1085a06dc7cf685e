// TokenDataset: one memory-mapped token shard and the batches drawn from it. Training
// windows start at offsets that are a pure function of (seed, step, sequence index in the
// global batch), so any split of a global batch over ranks and micro-batches, and any restart
// at step k, sees exactly the tokens a single process would. Validation walks in order.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "loom/data/shard_format.h"
#include "loom/io/file.h"

namespace loom::data {

struct DatasetOptions {
  int64_t model_vocab = -1;  // > 0: check the shard against the model's vocabulary on open
  uint64_t seed = 0;         // seeds the training windows
  bool verify = true;        // check the payload checksum and every token id on open (one pass)
  std::FILE* log = nullptr;  // where a verification that takes log_after_s or more says so
  double log_after_s = 1.0;
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

  // One pass over the payload: recomputes its FNV-1a 64 against the header's and checks every
  // id < vocab_size. A checksum mismatch is reported first (it explains a bad id too). When
  // `log` is set and the pass reaches `log_after_s` seconds, it logs a line when it gets
  // there and one when it is done.
  void verify(std::FILE* log = nullptr, double log_after_s = 1.0) const;
  // Throws "[data] DIR/train.bin has vocab_size 256 but the model has 50257; ..." unless the
  // model's vocabulary covers the shard's (models may pad theirs up to a multiple of 64..1024).
  void check_vocab(int64_t model_vocab) const;

  // Start of training window `seq` of the global batch at `step`: uniform over every offset
  // whose T+1 tokens fit, from Philox keyed (seed, hash_name("loader"), step*global_batch+seq).
  int64_t window_start(int64_t step, int64_t seq, int64_t global_batch, int64_t T) const;
  // Rows [first_seq, first_seq + n_seqs) of the global batch at `step`: tokens[r*T + t] is
  // the window's t-th token and targets[r*T + t] the (t+1)-th. Rank r of W data-parallel
  // ranks passes first_seq = r * global_batch / W.
  void fill_batch(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t global_batch, int64_t T, int32_t* tokens,
                  int32_t* targets) const;

  // Validation: non-overlapping windows start at 0, T, 2T, ...; batch `index` takes windows
  // index*B .. index*B + B - 1, wrapping around after the last.
  int64_t eval_windows(int64_t T) const;
  void fill_eval_batch(int64_t index, int64_t B, int64_t T, int32_t* tokens, int32_t* targets) const;

 private:
  std::string label() const;
  int64_t byte_offset(int64_t token_index) const;
  [[noreturn]] void fail_bad_id(int64_t index, uint32_t id, const char* fix) const;
  void check_window(int64_t T, const char* what) const;
  void copy_window(int64_t start, int64_t T, int32_t* tokens, int32_t* targets) const;

  std::shared_ptr<const io::MappedFile> file_;
  ShardHeader header_;
  uint64_t seed_ = 0;
};

}  // namespace loom::data
