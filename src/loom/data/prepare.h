// `loom prepare` as a library call: text files -> DIR/train.bin, DIR/val.bin, DIR/meta.json.
// The validation split is the last val_fraction of the token stream. Inputs are checked
// (readable, non-empty, text rather than binary) before anything is written.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace loom::data {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string tokenizer = "gpt2";
  std::string out_dir;
  std::string data_dir;       // tokenizer files; empty: default_data_dir()
  double val_fraction = 0.1;  // in [0, 1)
  bool force = false;         // overwrite shards in an existing, non-empty out_dir
  double max_garbage_fraction = 0.3;
  // Called now and then with (input bytes tokenised so far, total input bytes).
  std::function<void(size_t, size_t)> progress;
};

struct PreparedSource {
  std::string path;
  int64_t bytes = 0, tokens = 0;
};

struct PrepareResult {
  std::string tokenizer;
  int32_t vocab_size = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<PreparedSource> sources;
  // Cross-entropy (nats/token) on val of a unigram model fitted on train: the loss any
  // trained model must beat. NaN when val is empty.
  double unigram_val_nats = 0;
  double seconds = 0;
};

PrepareResult prepare(const PrepareOptions& opt);

// Cross-entropy in nats/token of `eval` under the unigram distribution of `fit` with add-1/2
// (Krichevsky-Trofimov) smoothing over the whole vocabulary, so unseen ids stay finite.
double unigram_cross_entropy(std::span<const int64_t> fit_counts, int64_t fit_total,
                             std::span<const int64_t> eval_counts);

}  // namespace loom::data
