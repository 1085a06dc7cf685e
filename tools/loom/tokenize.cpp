// `loom tokenize`: stdin text -> space-separated token ids on stdout, or with --decode the
// reverse, with any tokenizer make_tokenizer opens (gpt2, byte, a GGUF file, a tokenizer.json
// or a model's folder). Without --special, special tokens are neither made nor printed, so
// decode(encode(x)) == x for every byte-level tokenizer; with it, both directions keep them.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "loom/model/model_source.h"
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

std::string tokenizer_help() {
  std::string names;
  for (const auto& n : data::tokenizer_names()) names += (names.empty() ? "" : ", ") + n;
  return "the tokenizer: " + names;
}

}  // namespace

int cmd_tokenize(const std::vector<std::string>& argv) {
  auto app = new_app("tokenize",
                     "Encodes stdin (any bytes) to space-separated token ids on one line, or with "
                     "--decode the reverse. Special-token texts (\"<|im_end|>\") encode as plain text "
                     "and special ids decode to nothing, unless --special.");
  std::string tokenizer = "gpt2", model, data_dir;
  bool decode = false, special = false, add_bos = false;
  auto* tok_opt = app->add_option("--tokenizer", tokenizer, tokenizer_help())->type_name("SPEC");
  app->add_option("--model", model, "take the tokenizer of this model (a GGUF file or a Hugging Face folder)")
      ->type_name("PATH")
      ->excludes(tok_opt);
  app->add_flag("--decode", decode, "read whitespace-separated ids from stdin and write their bytes");
  app->add_flag("--special", special,
                "encode special-token texts as their ids (as HF tokenizers do by default); with "
                "--decode, print special tokens too (HF's skip_special_tokens=False)");
  app->add_flag("--add-bos", add_bos, "begin the ids with the tokenizer's BOS id (an error if it has none)");
  app->add_option("--data-dir", data_dir,
                  "folder holding gpt2/encoder.json and gpt2/vocab.bpe (default: $LOOM_DATA_DIR or the source "
                  "tree's data/)")
      ->type_name("DIR");
  if (auto rc = parse(*app, argv)) return *rc;
  if (decode && add_bos) throw UsageError("[tokenize] --add-bos is for encoding; drop it or --decode");
  if (!model.empty()) tokenizer = model::read_model_card(model).tokenizer;
  auto tok = data::make_tokenizer(tokenizer, data_dir);
  const std::string input = read_stdin();
  if (decode) {
    const std::vector<int32_t> ids = parse_ids(input);
    const std::string bytes = special ? tok->decode(ids) : tok->decode_skip_special(ids);
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    return 0;
  }
  std::vector<int32_t> ids;
  if (add_bos) {
    const auto bos = tok->bos_id();
    if (!bos) throw Error(str_cat("[tokenize] --add-bos: tokenizer ", tok->name(), " has no BOS token"));
    ids.push_back(*bos);
  }
  if (special)
    tok->encode_special_append(input, ids);
  else
    tok->encode_append(input, ids);
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
