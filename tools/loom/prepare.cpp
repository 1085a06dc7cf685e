// `loom prepare`: tokenise text files into train/val token shards (see docs/DATA.md), with a
// progress bar on a terminal and a closing summary that quotes the unigram baseline loss.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/data/prepare.h"
#include "loom/data/tokenizer.h"
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

}  // namespace

int cmd_prepare(const std::vector<std::string>& argv) {
  auto app = new_app("prepare",
                     "Tokenises the inputs (each one a document; gpt2 puts <|endoftext|> before each) and writes "
                     "DIR/train.bin, DIR/val.bin (the last --val-fraction of the tokens) and DIR/meta.json. Ends "
                     "with the unigram baseline: the validation loss of a model that only knows token frequencies.");
  data::PrepareOptions opt;
  opt.tokenizer = "gpt2";
  opt.val_fraction = 0.1;
  bool quiet = false;
  app->add_option("--input", opt.inputs, "a text file, one document (repeatable)")->type_name("FILE")->required();
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
  app->add_option("--val-fraction", opt.val_fraction, "the share of tokens, at the end, for val.bin")
      ->check(in_range(0, 1));
  app->add_flag("--force", opt.force, "write into a non-empty DIR (refused without it)");
  app->add_option("--data-dir", opt.data_dir,
                  "folder holding gpt2/encoder.json and gpt2/vocab.bpe (default: $LOOM_DATA_DIR or the source "
                  "tree's data/)")
      ->type_name("DIR");
  app->add_flag("--quiet", quiet, "no progress bar");
  if (auto rc = parse(*app, argv)) return *rc;
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
  std::printf("[prepare] %s/train.bin: %lld tokens, %s/val.bin: %lld tokens (the last %.1f%%)\n", opt.out_dir.c_str(),
              (long long)r.train_tokens, opt.out_dir.c_str(), (long long)r.val_tokens, 100.0 * opt.val_fraction);
  if (std::isfinite(r.unigram_val_nats))
    std::printf(
        "[prepare] unigram baseline: %.3f nats/token (val cross-entropy of train token frequencies; "
        "a trained model must go below this)\n",
        r.unigram_val_nats);
  nlohmann::json summary = {{"tokenizer", r.tokenizer},
                            {"vocab_size", r.vocab_size},
                            {"train_tokens", r.train_tokens},
                            {"val_tokens", r.val_tokens},
                            {"input_bytes", bytes},
                            {"seconds", r.seconds},
                            {"unigram_val_nats", std::isfinite(r.unigram_val_nats) ? nlohmann::json(r.unigram_val_nats)
                                                                                   : nlohmann::json(nullptr)}};
  std::printf("SUMMARY %s\n", summary.dump().c_str());
  return 0;
}

}  // namespace loom::cli
