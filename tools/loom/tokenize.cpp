// `loom tokenize`: stdin text -> space-separated token ids on stdout, or with --decode the
// reverse. Bytes pass through untouched, so any file round-trips.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "tools/loom/commands.h"

namespace loom::cli {
namespace {

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  return ss.str();
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != word.size() || v < 0 || v > INT32_MAX)
      throw UsageError(
          str_cat("[tokenize] --decode expects non-negative integer ids; word ", ids.size() + 1, " is \"", word, "\""));
    ids.push_back(int32_t(v));
  }
  return ids;
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& argv) {
  auto app = new_app("tokenize",
                     "Encodes stdin (any bytes) to space-separated token ids on one line, or with "
                     "--decode the reverse.");
  std::string tokenizer = "gpt2", data_dir;
  bool decode = false;
  app->add_option("--tokenizer", tokenizer, "the tokenizer")->check(one_of({"gpt2", "byte"}));
  app->add_flag("--decode", decode, "read whitespace-separated ids from stdin and write their bytes");
  app->add_option("--data-dir", data_dir,
                  "folder holding gpt2/encoder.json and gpt2/vocab.bpe (default: $LOOM_DATA_DIR or the source "
                  "tree's data/)")
      ->type_name("DIR");
  if (auto rc = parse(*app, argv)) return *rc;
  auto tok = data::make_tokenizer(tokenizer, data_dir);
  const std::string input = read_stdin();
  if (decode) {
    const std::string bytes = tok->decode(parse_ids(input));
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    return 0;
  }
  const std::vector<int32_t> ids = tok->encode(input);
  std::string out;
  out.reserve(ids.size() * 6);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace loom::cli
