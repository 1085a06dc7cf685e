// `loom prepare` as a library call: text files, or JSONL files of conversations, -> DIR/train.bin,
// DIR/val.bin, DIR/meta.json. The validation split is the last val_fraction of the token stream
// (of the conversations, for chat). Inputs are checked (readable, non-empty, text rather than
// binary) before anything is written; a bad conversation stops the run with nothing written.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/data/conversation.h"

namespace loom::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files, one document each
  // JSONL files of conversations (one {"messages": [...]} per line), instead of `inputs`: the
  // shards get a loss mask that trains the assistant replies (conversation.h).
  std::vector<std::string> chat_inputs;
  std::optional<ChatTemplateText> chat_template;  // required with chat_inputs
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
  int64_t conversations = 0, trained_tokens = 0;  // chat inputs
};

struct PrepareResult {
  std::string tokenizer;
  int32_t vocab_size = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  bool chat = false;
  int64_t train_conversations = 0, val_conversations = 0;
  int64_t train_trained_tokens = 0, val_trained_tokens = 0;  // targets the loss counts (chat)
  std::vector<PreparedSource> sources;
  // Cross-entropy (nats/token) on val of a unigram model fitted on train: the loss any
  // trained model must beat. For chat, over the trained tokens only. NaN when val is empty.
  double unigram_val_nats = 0;
  double seconds = 0;
};

PrepareResult prepare(const PrepareOptions& opt);

// Cross-entropy in nats/token of `eval` under the unigram distribution of `fit` with add-1/2
// (Krichevsky-Trofimov) smoothing over the whole vocabulary, so unseen ids stay finite.
double unigram_cross_entropy(std::span<const int64_t> fit_counts, int64_t fit_total,
                             std::span<const int64_t> eval_counts);

}  // namespace loom::data
