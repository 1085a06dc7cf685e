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

const char* kTokenizeHelp =
    "usage: loom tokenize [--tokenizer gpt2|byte] [--decode] [--data-dir DIR] < input\n\n"
    "  encodes stdin (any bytes) to space-separated token ids, one line;\n"
    "  --decode   reads whitespace-separated ids from stdin and writes their bytes\n"
    "  --data-dir folder holding gpt2/encoder.json and gpt2/vocab.bpe (default: $LOOM_DATA_DIR or\n"
    "             the source tree's data/)\n";

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
      throw UsageError(str_cat("[tokenize] --decode expects non-negative integer ids; word ", ids.size() + 1,
                               " is \"", word, "\""));
    ids.push_back(int32_t(v));
  }
  return ids;
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& argv) {
  Args args("tokenize", argv, {{"tokenizer", true}, {"decode", false}, {"data-dir", true}, {"help", false}});
  if (args.has("help")) {
    std::printf("%s", kTokenizeHelp);
    return 0;
  }
  if (!args.positional().empty())
    throw UsageError("[tokenize] unexpected argument '" + args.positional()[0] + "'; input comes from stdin");
  auto tok = data::make_tokenizer(args.get("tokenizer", "gpt2"), args.get("data-dir", ""));
  const std::string input = read_stdin();
  if (args.has("decode")) {
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
