// GGUF tokenizer metadata -> PipelineSpec. Token types (llama.cpp's numbering): 1 normal,
// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte. Control tokens become special added
// tokens and user-defined ones plain added tokens, as convert_hf_to_gguf.py got them from
// tokenizer.json; tokenizer.ggml.pre picks the pre-tokenizer the HF tokenizer has.
#include "loom/data/gguf_tokenizer.h"

#include "loom/core/error.h"
#include "loom/io/gguf.h"

namespace loom::data {
namespace {

enum TokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

std::unique_ptr<PreTokenizer> gpt2_pre_tokenizer(const std::string& pre, const std::string& where,
                                                 bool* ignore_merges) {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  if (pre == "smollm") {  // Digits(individual_digits) then ByteLevel's GPT-2 regex
    steps.push_back(make_digits_pretokenizer(true));
    steps.push_back(make_byte_level_pretokenizer(false, true));
  } else if (pre == "llama-bpe" || pre == "llama3") {
    steps.push_back(make_split_pretokenizer(SplitRegex::kLlama3));
    steps.push_back(make_byte_level_pretokenizer(false, false));
    *ignore_merges = true;
  } else if (pre == "qwen2") {
    steps.push_back(make_split_pretokenizer(SplitRegex::kQwen2));
    steps.push_back(make_byte_level_pretokenizer(false, false));
  } else if (pre == "default" || pre == "gpt-2" || pre == "gpt2") {
    steps.push_back(make_byte_level_pretokenizer(false, true));
  } else {
    fail("tokenizer", where, ": tokenizer.ggml.pre '", pre,
         "' is not supported; loom knows smollm, llama-bpe, llama3, qwen2, default, gpt-2 and gpt2 (or use the model's "
         "tokenizer.json)");
  }
  return make_sequence_pretokenizer(std::move(steps));
}

}  // namespace

std::unique_ptr<PipelineTokenizer> gguf_tokenizer_from(const io::GgufFile& f) {
  const std::string& where = f.path();
  LOOM_CHECK(f.has("tokenizer.ggml.model"), "tokenizer", where,
             ": no tokenizer.ggml.model; this GGUF carries no tokenizer, give the model's tokenizer.json instead");
  const std::string model = f.get_string("tokenizer.ggml.model");
  LOOM_CHECK(model == "gpt2", "tokenizer", where, ": tokenizer.ggml.model '", model,
             "' is not supported; loom reads \"gpt2\" (byte-level BPE) vocabularies from GGUF, use the model's "
             "tokenizer.json for others");
  std::vector<std::string> tokens = f.get_strings("tokenizer.ggml.tokens");
  LOOM_CHECK(!tokens.empty(), "tokenizer", where, ": tokenizer.ggml.tokens is empty");
  std::vector<int64_t> types = f.has("tokenizer.ggml.token_type") ? f.get_ints("tokenizer.ggml.token_type")
                                                                  : std::vector<int64_t>(tokens.size(), kNormal);
  LOOM_CHECK(types.size() == tokens.size(), "tokenizer", where, ": tokenizer.ggml.token_type has ", types.size(),
             " entries for ", tokens.size(), " tokens; the file is corrupt");
  std::vector<std::pair<std::string, std::string>> merges;
  if (f.has("tokenizer.ggml.merges")) {
    for (const std::string& m : f.get_strings("tokenizer.ggml.merges")) {
      const size_t sp = m.find(' ', 1);
      LOOM_CHECK(sp != std::string::npos, "tokenizer", where, ": merge '", m,
                 "' is not two tokens separated by a space");
      merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
  }

  PipelineSpec spec;
  spec.name = where;
  BpeOptions o;
  o.byte_level = true;
  spec.pre_tokenizer = gpt2_pre_tokenizer(f.get_string("tokenizer.ggml.pre", "default"), where, &o.ignore_merges);
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] == kControl || types[id] == kUserDefined) {
      AddedToken t;
      t.content = tokens[id];
      t.id = int32_t(id);
      t.special = types[id] == kControl;
      spec.added.push_back(std::move(t));
    }
  }
  auto optional_id = [&](const char* key) -> std::optional<int32_t> {
    const int64_t v = f.get_int(key, -1);
    if (v < 0) return std::nullopt;
    LOOM_CHECK(v < int64_t(tokens.size()), "tokenizer", where, ": ", key, " = ", v, " is outside the vocabulary (0..",
               tokens.size() - 1, ")");
    return int32_t(v);
  };
  spec.bos = optional_id("tokenizer.ggml.bos_token_id");
  spec.eos = optional_id("tokenizer.ggml.eos_token_id");
  // HF's BPE for these models has no unk_token (bytes without a token are dropped), so the
  // unknown id is not used for encoding.
  (void)optional_id("tokenizer.ggml.unknown_token_id");
  (void)optional_id("tokenizer.ggml.padding_token_id");
  if (f.get_bool("tokenizer.ggml.add_bos_token", false) && spec.bos) spec.prefix_ids = {*spec.bos};
  if (f.get_bool("tokenizer.ggml.add_eos_token", false) && spec.eos) spec.suffix_ids = {*spec.eos};
  spec.decoder.push_back({DecodeStep::Kind::kByteLevel, "", "", 0, 0, true});
  spec.model = std::make_unique<BpeModel>(std::move(tokens), merges, o, where);
  return std::make_unique<PipelineTokenizer>(std::move(spec));
}

std::unique_ptr<PipelineTokenizer> load_gguf_tokenizer(const std::string& path) {
  return gguf_tokenizer_from(io::GgufFile::open(path));
}

}  // namespace loom::data
