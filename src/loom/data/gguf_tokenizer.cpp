// GGUF tokenizer metadata -> a tokenizer. "gpt2" vocabularies become a PipelineSpec: control
// tokens special added tokens and user-defined ones plain added tokens, as
// convert_hf_to_gguf.py got them from tokenizer.json, and tokenizer.ggml.pre picks the
// pre-tokenizer the HF tokenizer has. "llama" vocabularies become an SpmVocab, with llama.cpp's
// defaults for the keys a file leaves out.
#include "loom/data/gguf_tokenizer.h"

#include "loom/core/error.h"
#include "loom/data/pipeline_tokenizer.h"
#include "loom/data/spm_tokenizer.h"
#include "loom/io/gguf.h"

namespace loom::data {
namespace {

// The token id under `key`, `fallback` where the file has none (llama.cpp's defaults, which
// it drops when they are outside the vocabulary); an id outside the vocabulary is an error.
std::optional<int32_t> token_id_key(const io::GgufFile& f, const char* key, size_t n_tokens,
                                    std::optional<int32_t> fallback = std::nullopt) {
  if (!f.has(key)) return fallback && size_t(*fallback) < n_tokens ? fallback : std::nullopt;
  const int64_t v = f.get_int(key);
  if (v < 0) return std::nullopt;
  LOOM_CHECK(v < int64_t(n_tokens), "tokenizer", f.path(), ": ", key, " = ", v, " is outside the vocabulary (0..",
             n_tokens - 1, ")");
  return int32_t(v);
}

// tokenizer.ggml.token_type, or all normal where the file has none; values llama.cpp does not
// know count as undefined, as there.
std::vector<GgufTokenType> token_types(const io::GgufFile& f, size_t n_tokens) {
  std::vector<GgufTokenType> types(n_tokens, GgufTokenType::kNormal);
  if (!f.has("tokenizer.ggml.token_type")) return types;
  const std::vector<int64_t> raw = f.get_ints("tokenizer.ggml.token_type");
  LOOM_CHECK(raw.size() == n_tokens, "tokenizer", f.path(), ": tokenizer.ggml.token_type has ", raw.size(),
             " entries for ", n_tokens, " tokens; the file is corrupt");
  for (size_t i = 0; i < n_tokens; ++i)
    types[i] = raw[i] >= 1 && raw[i] <= 6 ? GgufTokenType(raw[i]) : GgufTokenType::kUndefined;
  return types;
}

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

std::unique_ptr<Tokenizer> gpt2_vocabulary(const io::GgufFile& f) {
  const std::string& where = f.path();
  std::vector<std::string> tokens = f.get_strings("tokenizer.ggml.tokens");
  LOOM_CHECK(!tokens.empty(), "tokenizer", where, ": tokenizer.ggml.tokens is empty");
  const std::vector<GgufTokenType> types = token_types(f, tokens.size());
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
    if (types[id] == GgufTokenType::kControl || types[id] == GgufTokenType::kUserDefined) {
      AddedToken t;
      t.content = tokens[id];
      t.id = int32_t(id);
      t.special = types[id] == GgufTokenType::kControl;
      spec.added.push_back(std::move(t));
    }
  }
  spec.bos = token_id_key(f, "tokenizer.ggml.bos_token_id", tokens.size());
  spec.eos = token_id_key(f, "tokenizer.ggml.eos_token_id", tokens.size());
  // HF's BPE for these models has no unk_token (bytes without a token are dropped), so the
  // unknown id is not used for encoding.
  (void)token_id_key(f, "tokenizer.ggml.unknown_token_id", tokens.size());
  (void)token_id_key(f, "tokenizer.ggml.padding_token_id", tokens.size());
  if (f.get_bool("tokenizer.ggml.add_bos_token", false) && spec.bos) spec.prefix_ids = {*spec.bos};
  if (f.get_bool("tokenizer.ggml.add_eos_token", false) && spec.eos) spec.suffix_ids = {*spec.eos};
  spec.decoder.push_back({DecodeStep::Kind::kByteLevel, "", "", 0, 0, true});
  spec.model = std::make_unique<BpeModel>(std::move(tokens), merges, o, where);
  return std::make_unique<PipelineTokenizer>(std::move(spec));
}

std::unique_ptr<Tokenizer> spm_vocabulary(const io::GgufFile& f) {
  SpmVocab v;
  v.name = f.path();
  v.pieces = f.get_strings("tokenizer.ggml.tokens");
  const size_t n = v.pieces.size();
  LOOM_CHECK(n > 0, "tokenizer", v.name, ": tokenizer.ggml.tokens is empty");
  for (size_t id = 0; id < n; ++id) {  // llama.cpp's name for an empty piece, which keeps pieces distinct
    if (v.pieces[id].empty()) v.pieces[id] = "[EMPTY_" + std::to_string(id) + "]";
  }
  v.scores.assign(n, 0.0f);
  if (f.has("tokenizer.ggml.scores")) {
    const std::vector<double> scores = f.get_floats("tokenizer.ggml.scores");
    LOOM_CHECK(scores.size() == n, "tokenizer", v.name, ": tokenizer.ggml.scores has ", scores.size(), " entries for ",
               n, " tokens; the file is corrupt");
    for (size_t i = 0; i < n; ++i) v.scores[i] = float(scores[i]);
  }
  v.types = token_types(f, n);
  v.bos = token_id_key(f, "tokenizer.ggml.bos_token_id", n, 1);
  v.eos = token_id_key(f, "tokenizer.ggml.eos_token_id", n, 2);
  v.unk = token_id_key(f, "tokenizer.ggml.unknown_token_id", n, 0);
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", true);
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", true);
  return std::make_unique<SpmTokenizer>(std::move(v));
}

}  // namespace

std::unique_ptr<Tokenizer> gguf_tokenizer_from(const io::GgufFile& f) {
  const std::string& where = f.path();
  LOOM_CHECK(f.has("tokenizer.ggml.model"), "tokenizer", where,
             ": no tokenizer.ggml.model; this GGUF carries no tokenizer, give the model's tokenizer.json instead");
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model == "gpt2") return gpt2_vocabulary(f);
  if (model == "llama") return spm_vocabulary(f);
  fail("tokenizer", where, ": tokenizer.ggml.model '", model,
       "' is not supported; loom reads GGUF vocabularies of model \"gpt2\" (byte-level BPE) and \"llama\" "
       "(SentencePiece-style, with scores); for another give the model's tokenizer.json if loom reads that");
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path) {
  return gguf_tokenizer_from(io::GgufFile::open(path));
}

}  // namespace loom::data
