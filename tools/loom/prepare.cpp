// `loom prepare`: tokenise text files, or conversations rendered with a model's chat template,
// into train/val token shards (see docs/DATA.md), with a progress bar on a terminal and a
// closing summary that quotes the unigram baseline loss.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/data/prepare.h"
#include "loom/data/tokenizer.h"
#include "loom/io/file.h"
#include "loom/io/gguf.h"
#include "loom/model/model_source.h"
#include "tools/loom/commands.h"

namespace loom::cli {
namespace {

void draw_bar(size_t done, size_t total) {
  const double frac = total ? double(done) / double(total) : 1.0;
  const int width = 40, filled = int(frac * width);
  std::fprintf(stderr, "\r[prepare] [%.*s%*s] %5.1f%% %.1f/%.1f MB", filled, "########################################",
               width - filled, "", 100.0 * frac, double(done) / 1e6, double(total) / 1e6);
  std::fflush(stderr);
}

// The template `--chat` renders with: --chat-template FILE, else the tokenizer source's own, found
// where `loom chat` finds it (a GGUF's tokenizer.chat_template; a folder's tokenizer_config.json
// or chat_template.jinja, with its bos and eos tokens).
data::ChatTemplateText chat_template_for(const std::string& tokenizer, const std::string& file) {
  namespace fs = std::filesystem;
  data::ChatTemplateText t;
  if (!file.empty()) {
    t.source = io::read_file(file);
    t.name = file;
    return t;
  }
  const fs::path p(tokenizer);
  if (fs::is_regular_file(p) && p.extension() == ".gguf") {
    t.source = io::GgufFile::open(tokenizer).get_string("tokenizer.chat_template", "");
    t.name = tokenizer + ":tokenizer.chat_template";
  } else if (fs::exists(p)) {
    model::ModelCard card;
    model::read_chat_files(fs::is_directory(p) ? p.string() : p.parent_path().string(), card);
    t.source = card.chat_template;
    t.name = card.chat_template_source;
    if (!card.bos_token.empty()) t.bos_token = card.bos_token;
    if (!card.eos_token.empty()) t.eos_token = card.eos_token;
  }
  LOOM_CHECK(!t.source.empty(), "prepare", "--tokenizer ", tokenizer,
             " carries no chat template; pass --chat-template FILE (a Jinja chat template such as a model's "
             "chat_template.jinja)");
  return t;
}

}  // namespace

int cmd_prepare(const std::vector<std::string>& argv) {
  auto app = new_app("prepare",
                     "Tokenises the inputs (each one a document; gpt2 puts <|endoftext|> before each), or with --chat "
                     "conversations through the tokenizer's chat template with a loss mask that trains the assistant "
                     "replies, and writes DIR/train.bin, DIR/val.bin (the last --val-fraction of the tokens, or of "
                     "the conversations) and DIR/meta.json. Ends with the unigram baseline: the validation loss of "
                     "a model that only knows token frequencies.");
  data::PrepareOptions opt;
  opt.tokenizer = "gpt2";
  opt.val_fraction = 0.1;
  bool quiet = false;
  std::string template_file;
  app->add_option("--input", opt.inputs, "a text file, one document (repeatable)")->type_name("FILE");
  app->add_option("--chat", opt.chat_inputs,
                  "a JSONL file of conversations, one {\"messages\": [{\"role\", \"content\"}, ...]} per line, "
                  "roles system, user and assistant (repeatable; instead of --input)")
      ->type_name("FILE.jsonl");
  app->add_option("--chat-template", template_file,
                  "with --chat: a Jinja chat template file (default: the --tokenizer source's own)")
      ->type_name("FILE");
  app->add_option("--out", opt.out_dir, "the output folder")->type_name("DIR")->required();
  app->add_option("--tokenizer", opt.tokenizer,
                  "gpt2, byte, or a model's own: a .gguf file, a tokenizer.json, or a Hugging Face directory "
                  "holding one (what model.init_from trains with)")
      ->type_name("NAME|PATH")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const auto& names = data::tokenizer_names();  // the built-in ones, then the path forms
            if (std::find(names.begin(), names.end(), v) != names.end() || std::filesystem::exists(v)) return "";
            return v + ": expected gpt2, byte, or the path of a .gguf file, a tokenizer.json or a folder holding one";
          },
          ""));
  app->add_option("--val-fraction", opt.val_fraction,
                  "the share of tokens (of conversations, with --chat), at the end, for val.bin")
      ->check(in_range(0, 1));
  app->add_flag("--force", opt.force, "write into a non-empty DIR (refused without it)");
  app->add_option("--data-dir", opt.data_dir,
                  "folder holding gpt2/encoder.json and gpt2/vocab.bpe (default: $LOOM_DATA_DIR or the source "
                  "tree's data/)")
      ->type_name("DIR");
  app->add_flag("--quiet", quiet, "no progress bar");
  if (auto rc = parse(*app, argv)) return *rc;
  if (opt.inputs.empty() == opt.chat_inputs.empty())
    throw UsageError("[prepare] pass --input FILE (text) or --chat FILE.jsonl (conversations), one of the two");
  if (!template_file.empty() && opt.chat_inputs.empty())
    throw UsageError("[prepare] --chat-template renders --chat conversations; pass --chat FILE.jsonl");
  if (!opt.chat_inputs.empty()) opt.chat_template = chat_template_for(opt.tokenizer, template_file);
  const bool bar = !quiet && isatty(STDERR_FILENO);
  size_t last_drawn = 0;
  if (bar)
    opt.progress = [&](size_t done, size_t total) {
      const size_t every = std::max<size_t>(1, std::min<size_t>(size_t(1) << 20, total / 200));
      if (done == total || last_drawn == 0 || done - last_drawn >= every) {
        draw_bar(done, total);
        last_drawn = done;
      }
    };
  const data::PrepareResult r = data::prepare(opt);
  if (bar) std::fprintf(stderr, "\n");

  int64_t bytes = 0;
  for (const auto& s : r.sources) bytes += s.bytes;
  const int64_t total = r.train_tokens + r.val_tokens;
  std::printf("[prepare] %s: %zu file(s), %lld bytes -> %lld tokens in %.2f s (%.2f MB/s)\n", r.tokenizer.c_str(),
              r.sources.size(), (long long)bytes, (long long)total, r.seconds, double(bytes) / 1e6 / r.seconds);
  std::printf("[prepare] %s/train.bin: %lld tokens, %s/val.bin: %lld tokens (the last %.1f%%%s)\n", opt.out_dir.c_str(),
              (long long)r.train_tokens, opt.out_dir.c_str(), (long long)r.val_tokens, 100.0 * opt.val_fraction,
              r.chat ? " of the conversations" : "");
  if (r.chat)
    std::printf(
        "[prepare] %lld + %lld conversations through %s; trained tokens (assistant replies): %lld of %lld in "
        "train.bin, %lld of %lld in val.bin\n",
        (long long)r.train_conversations, (long long)r.val_conversations, opt.chat_template->name.c_str(),
        (long long)r.train_trained_tokens, (long long)r.train_tokens, (long long)r.val_trained_tokens,
        (long long)r.val_tokens);
  if (std::isfinite(r.unigram_val_nats))
    std::printf(
        "[prepare] unigram baseline: %.3f nats/token (val cross-entropy of train token frequencies%s; "
        "a trained model must go below this)\n",
        r.unigram_val_nats, r.chat ? ", over the trained tokens" : "");
  nlohmann::json summary = {{"tokenizer", r.tokenizer},
                            {"vocab_size", r.vocab_size},
                            {"train_tokens", r.train_tokens},
                            {"val_tokens", r.val_tokens},
                            {"input_bytes", bytes},
                            {"seconds", r.seconds},
                            {"conversations", r.train_conversations + r.val_conversations},
                            {"trained_tokens", r.train_trained_tokens + r.val_trained_tokens},
                            {"unigram_val_nats", std::isfinite(r.unigram_val_nats) ? nlohmann::json(r.unigram_val_nats)
                                                                                   : nlohmann::json(nullptr)}};
  std::printf("SUMMARY %s\n", summary.dump().c_str());
  return 0;
}

}  // namespace loom::cli
