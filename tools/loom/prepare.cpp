// `loom prepare`: tokenise text files into train/val token shards (see docs/DATA.md), with a
// progress bar on a terminal and a closing summary that quotes the unigram baseline loss.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/data/prepare.h"
#include "tools/loom/commands.h"

namespace loom::cli {
namespace {

const char* kPrepareHelp =
    "usage: loom prepare --input FILE [--input FILE ...] --out DIR [--tokenizer gpt2|byte]\n"
    "                    [--val-fraction 0.1] [--force] [--data-dir DIR] [--quiet]\n\n"
    "  tokenises the inputs (each one a document; gpt2 puts <|endoftext|> before each) and\n"
    "  writes DIR/train.bin, DIR/val.bin (the last --val-fraction of the tokens) and\n"
    "  DIR/meta.json. Refuses a non-empty DIR unless --force. Ends with the unigram\n"
    "  baseline: the validation loss of a model that only knows token frequencies.\n";

void draw_bar(size_t done, size_t total) {
  const double frac = total ? double(done) / double(total) : 1.0;
  const int width = 40, filled = int(frac * width);
  std::fprintf(stderr, "\r[prepare] [%.*s%*s] %5.1f%% %.1f/%.1f MB", filled,
               "########################################", width - filled, "", 100.0 * frac, double(done) / 1e6,
               double(total) / 1e6);
  std::fflush(stderr);
}

}  // namespace

int cmd_prepare(const std::vector<std::string>& argv) {
  Args args("prepare", argv,
            {{"input", Args::kRepeated}, {"out", true}, {"tokenizer", true}, {"val-fraction", true}, {"force", false},
             {"data-dir", true}, {"quiet", false}, {"help", false}});
  if (args.has("help")) {
    std::printf("%s", kPrepareHelp);
    return 0;
  }
  if (!args.positional().empty())
    throw UsageError("[prepare] unexpected argument '" + args.positional()[0] + "'; pass inputs as --input FILE");
  data::PrepareOptions opt;
  opt.inputs = args.get_all("input");
  opt.out_dir = args.get("out", "");
  if (opt.inputs.empty()) throw UsageError("[prepare] no input; pass --input FILE (see loom prepare --help)");
  if (opt.out_dir.empty()) throw UsageError("[prepare] no output folder; pass --out DIR");
  opt.tokenizer = args.get("tokenizer", "gpt2");
  opt.val_fraction = args.get_double("val-fraction", 0.1);
  opt.force = args.has("force");
  opt.data_dir = args.get("data-dir", "");
  const bool bar = !args.has("quiet") && isatty(STDERR_FILENO);
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
  std::printf("[prepare] %s/train.bin: %lld tokens, %s/val.bin: %lld tokens (the last %.1f%%)\n",
              opt.out_dir.c_str(), (long long)r.train_tokens, opt.out_dir.c_str(), (long long)r.val_tokens,
              100.0 * opt.val_fraction);
  if (std::isfinite(r.unigram_val_nats))
    std::printf("[prepare] unigram baseline: %.3f nats/token (val cross-entropy of train token frequencies; "
                "a trained model must go below this)\n",
                r.unigram_val_nats);
  nlohmann::json summary = {{"tokenizer", r.tokenizer},     {"vocab_size", r.vocab_size},
                            {"train_tokens", r.train_tokens}, {"val_tokens", r.val_tokens},
                            {"input_bytes", bytes},           {"seconds", r.seconds},
                            {"unigram_val_nats", std::isfinite(r.unigram_val_nats)
                                                     ? nlohmann::json(r.unigram_val_nats)
                                                     : nlohmann::json(nullptr)}};
  std::printf("SUMMARY %s\n", summary.dump().c_str());
  return 0;
}

}  // namespace loom::cli
