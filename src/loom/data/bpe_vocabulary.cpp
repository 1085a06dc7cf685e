// Reading a byte-level BPE vocabulary from each form it comes in: GGUF metadata, a tokenizer.json
// (with its tokenizer_config.json), GPT-2's released files, loom's byte tokenizer. The writers
// are bpe_vocabulary_writers.cpp.
#include "loom/data/bpe_vocabulary.h"

#include <map>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/data/bpe_tokenizer.h"
#include "loom/data/pretokenizers.h"
#include "loom/io/file.h"
#include "loom/io/gguf.h"

namespace loom::data {

using nlohmann::json;

const char* gguf_pre_name(BytePreTokenizer p) {
  switch (p) {
    case BytePreTokenizer::gpt2: return "gpt-2";
    case BytePreTokenizer::smollm: return "smollm";
    case BytePreTokenizer::llama3: return "llama-bpe";
    case BytePreTokenizer::qwen2: return "qwen2";
  }
  return "gpt-2";
}

namespace {

// The names loom's GGUF reader accepts (gguf_tokenizer.cpp), each mapped to what it runs.
BytePreTokenizer pre_from_gguf_name(const std::string& pre, const std::string& where) {
  if (pre == "smollm") return BytePreTokenizer::smollm;
  if (pre == "llama-bpe" || pre == "llama3") return BytePreTokenizer::llama3;
  if (pre == "qwen2") return BytePreTokenizer::qwen2;
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2") return BytePreTokenizer::gpt2;
  fail("export", where, ": tokenizer.ggml.pre '", pre,
       "' is not one loom runs (smollm, llama-bpe, llama3, qwen2, default, gpt-2, gpt2), so it has no tokenizer.json "
       "form here; put the model's own tokenizer.json in the checkpoint instead");
}

std::optional<int32_t> gguf_token_id(const io::GgufFile& g, const char* key, size_t n) {
  const int64_t id = g.get_int(key, -1);
  return id >= 0 && id < int64_t(n) ? std::optional<int32_t>(int32_t(id)) : std::nullopt;
}

json parse_json(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("export", where, ": not valid JSON (", e.what(), ")");
  }
}

bool flag(const json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

std::string type_of(const json& j) { return j.is_object() ? j.value("type", std::string()) : std::string(); }

// The Split regex a pre-tokenizer step names, if it is an Isolated Split of one loom knows.
std::optional<SplitRegex> split_regex_of(const json& step) {
  if (type_of(step) != "Split" || !step.contains("pattern") || !step["pattern"].is_object()) return std::nullopt;
  const json& p = step["pattern"];
  if (!p.contains("Regex") || !p["Regex"].is_string()) return std::nullopt;
  if (step.value("behavior", std::string("Isolated")) != "Isolated" || flag(step, "invert", false)) return std::nullopt;
  return recognize_split_regex(p["Regex"].get<std::string>());
}

bool byte_level_step(const json& step, bool use_regex) {
  return type_of(step) == "ByteLevel" && !flag(step, "add_prefix_space", true) &&
         flag(step, "use_regex", true) == use_regex;
}

// The GGUF name of a tokenizer.json's pre-tokenizer, or a refusal naming it.
BytePreTokenizer pre_from_tokenizer_json(const json& pre, const std::string& where) {
  if (byte_level_step(pre, true)) return BytePreTokenizer::gpt2;
  if (type_of(pre) == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].size() == 2) {
    const json& a = pre["pretokenizers"][0];
    const json& b = pre["pretokenizers"][1];
    if (type_of(a) == "Digits" && flag(a, "individual_digits", false) && byte_level_step(b, true))
      return BytePreTokenizer::smollm;
    const std::optional<SplitRegex> r = split_regex_of(a);
    if (r == SplitRegex::kLlama3 && byte_level_step(b, false)) return BytePreTokenizer::llama3;
    if (r == SplitRegex::kQwen2 && byte_level_step(b, false)) return BytePreTokenizer::qwen2;
  }
  std::string text = pre.dump();
  if (text.size() > 160) text = text.substr(0, 160) + "...";
  fail("export", where, ": pre_tokenizer ", text,
       " has no GGUF pre-tokenizer name loom writes (it writes GPT-2's ByteLevel, SmolLM's Digits + ByteLevel, and "
       "Llama 3's or Qwen2's Split + ByteLevel); export --format hf keeps the tokenizer as it is");
}

// A special token as tokenizer_config.json writes it: a string, or {"content": ...}.
std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

void check_bpe_model(const json& m, const std::string& where) {
  const std::string type = m.value("type", std::string("BPE"));
  LOOM_CHECK(type == "BPE", "export", where, ": model type '", type,
             "' has no GGUF form loom writes (it writes byte-level BPE); export --format hf keeps it as it is");
  LOOM_CHECK(!flag(m, "byte_fallback", false), "export", where,
             ": a byte-fallback BPE (SentencePiece-style, as Llama 2's) has no GGUF form loom writes (it writes "
             "byte-level BPE); convert the original model with llama.cpp's convert_hf_to_gguf.py, or export --format "
             "hf");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    LOOM_CHECK(!m.contains(key) || m[key].is_null() || m[key] == "", "export", where, ": BPE ", key,
               " has no GGUF form; export --format hf keeps the tokenizer as it is");
  LOOM_CHECK(m.contains("vocab") && m["vocab"].is_object() && m.contains("merges") && m["merges"].is_array(), "export",
             where, ": model has no vocab object or merges list; not a tokenizer.json `tokenizers` writes");
}

// Fills v.tokens and v.types from the model's vocab and the added tokens; ids no entry names
// become unused "[PAD<id>]" tokens, as llama.cpp's converter writes them.
void read_tokens(const json& j, ByteLevelVocabulary& v, const std::string& where) {
  std::map<int64_t, std::pair<std::string, GgufTokenType>> by_id;
  for (const auto& [text, id] : j["model"]["vocab"].items()) {
    LOOM_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "export", where, ": vocab id of '", text,
               "' is not a non-negative integer");
    by_id[id.get<int64_t>()] = {text, GgufTokenType::kNormal};
  }
  for (const json& a : j.value("added_tokens", json::array())) {
    const int64_t id = a.at("id").get<int64_t>();
    const std::string content = a.at("content").get<std::string>();
    const bool special = flag(a, "special", false);
    by_id[id] = {content, special ? GgufTokenType::kControl : GgufTokenType::kUserDefined};
    for (const char* f : {"lstrip", "rstrip", "single_word"})
      if (flag(a, f, false))
        v.notes.push_back(str_cat("added token '", content, "' has ", f,
                                  ", which GGUF cannot say: text around it may encode differently there"));
  }
  LOOM_CHECK(!by_id.empty(), "export", where, ": the vocabulary is empty");
  const int64_t n = by_id.rbegin()->first + 1;
  v.tokens.assign(size_t(n), "");
  v.types.assign(size_t(n), GgufTokenType::kUnused);
  for (int64_t id = 0; id < n; ++id) v.tokens[size_t(id)] = str_cat("[PAD", id, "]");
  for (const auto& [id, entry] : by_id) {
    v.tokens[size_t(id)] = entry.first;
    v.types[size_t(id)] = entry.second;
  }
}

// What the post-processor puts around a text: a special token before sequence A (BOS) and after
// it (EOS), as loom's reader takes them.
void read_post_processor(const json& p, ByteLevelVocabulary& v) {
  if (type_of(p) == "Sequence") {
    for (const json& s : p.value("processors", json::array())) read_post_processor(s, v);
    return;
  }
  if (type_of(p) != "TemplateProcessing" || !p.contains("single")) return;
  bool seen_a = false;
  for (const json& item : p["single"]) {
    if (item.contains("Sequence")) {
      seen_a = true;
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    const json& ids = p.at("special_tokens").at(name).at("ids");
    (seen_a ? v.add_eos : v.add_bos) = true;
    if (ids.size() == 1) (seen_a ? v.eos : v.bos) = ids[0].get<int32_t>();
  }
}

}  // namespace

ByteLevelVocabulary vocabulary_from_gguf(const io::GgufFile& g) {
  const std::string& where = g.path();
  LOOM_CHECK(g.has("tokenizer.ggml.model"), "export", where,
             ": no tokenizer.ggml.model; the GGUF carries no tokenizer");
  const std::string model = g.get_string("tokenizer.ggml.model");
  LOOM_CHECK(model == "gpt2", "export", where, ": tokenizer.ggml.model '", model, "' (",
             model == "llama" ? "SentencePiece-style" : "not byte-level BPE",
             ") has no tokenizer.json form loom writes; export --format gguf keeps it as it is, or put the model's own "
             "tokenizer.json and tokenizer_config.json in the checkpoint");
  ByteLevelVocabulary v;
  v.pre = pre_from_gguf_name(g.get_string("tokenizer.ggml.pre", "default"), where);
  v.tokens = g.get_strings("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  LOOM_CHECK(n > 0, "export", where, ": tokenizer.ggml.tokens is empty");
  v.types.assign(n, GgufTokenType::kNormal);
  if (g.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> raw = g.get_ints("tokenizer.ggml.token_type");
    LOOM_CHECK(raw.size() == n, "export", where, ": tokenizer.ggml.token_type has ", raw.size(), " entries for ", n,
               " tokens; the file is corrupt");
    // As loom's reader takes them: control and user-defined are added tokens, the rest BPE tokens.
    for (size_t i = 0; i < n; ++i)
      if (raw[i] == 3 || raw[i] == 4 || raw[i] == 5) v.types[i] = GgufTokenType(raw[i]);
  }
  if (g.has("tokenizer.ggml.merges")) v.merges = g.get_strings("tokenizer.ggml.merges");
  v.bos = gguf_token_id(g, "tokenizer.ggml.bos_token_id", n);
  v.eos = gguf_token_id(g, "tokenizer.ggml.eos_token_id", n);
  v.unk = gguf_token_id(g, "tokenizer.ggml.unknown_token_id", n);
  v.pad = gguf_token_id(g, "tokenizer.ggml.padding_token_id", n);
  v.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", false) && v.bos;
  v.add_eos = g.get_bool("tokenizer.ggml.add_eos_token", false) && v.eos;
  return v;
}

ByteLevelVocabulary vocabulary_from_tokenizer_json(const std::string& json_text, const std::string& config_text,
                                                   const std::string& where) {
  const json j = parse_json(json_text, where);
  LOOM_CHECK(j.is_object() && j.contains("model"), "export", where, ": no \"model\"; not a tokenizer.json");
  ByteLevelVocabulary v;
  try {
    check_bpe_model(j["model"], where);
    const json norm = j.value("normalizer", json());
    const std::string nt = type_of(norm);
    LOOM_CHECK(norm.is_null() || nt == "NFC", "export", where, ": normalizer '", nt,
               "' has no GGUF form; export --format hf keeps the tokenizer as it is");
    if (nt == "NFC")
      v.notes.push_back("the NFC normalizer is not carried (GGUF has none; llama.cpp and loom's GGUF reader skip it)");
    LOOM_CHECK(j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null(), "export", where,
               ": no pre_tokenizer, so not a byte-level BPE; export --format hf keeps the tokenizer as it is");
    v.pre = pre_from_tokenizer_json(j["pre_tokenizer"], where);
    const bool ignore_merges = flag(j["model"], "ignore_merges", false);
    if (ignore_merges != (v.pre == BytePreTokenizer::llama3))
      v.notes.push_back(str_cat("the BPE's ignore_merges is ", ignore_merges ? "on" : "off", ", but GGUF's '",
                                gguf_pre_name(v.pre), "' implies it ", ignore_merges ? "off" : "on"));
    read_tokens(j, v, where);
    for (const json& m : j["model"]["merges"]) {
      if (m.is_string())
        v.merges.push_back(m.get<std::string>());
      else
        v.merges.push_back(str_cat(m.at(0).get<std::string>(), " ", m.at(1).get<std::string>()));
    }
    read_post_processor(j.value("post_processor", json()), v);
  } catch (const json::exception& e) {
    fail("export", where, ": unexpected layout (", e.what(), "); not a tokenizer.json `tokenizers` writes");
  }
  const json cfg = config_text.empty() ? json::object() : parse_json(config_text, where + " (tokenizer_config.json)");
  auto id_of = [&](const char* key) -> std::optional<int32_t> {
    const std::string text = cfg.contains(key) ? token_text(cfg[key]) : "";
    for (size_t i = 0; !text.empty() && i < v.tokens.size(); ++i)
      if (v.tokens[i] == text) return int32_t(i);
    return std::nullopt;
  };
  if (const auto id = id_of("bos_token")) v.bos = id;
  if (const auto id = id_of("eos_token")) v.eos = id;
  v.unk = id_of("unk_token");
  v.pad = id_of("pad_token");
  if (!v.add_bos && !v.add_eos) {  // the config says where the post-processor does not
    v.add_bos = cfg.value("add_bos_token", false);
    v.add_eos = cfg.value("add_eos_token", false);
  }
  // As loom's reader of tokenizer.json: without a configured eos, the end-of-text token of the
  // common families.
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>"})
    for (size_t i = 0; !v.eos && i < v.tokens.size(); ++i)
      if (v.tokens[i] == name) v.eos = int32_t(i);
  v.add_bos = v.add_bos && v.bos;
  v.add_eos = v.add_eos && v.eos;
  return v;
}

ByteLevelVocabulary gpt2_vocabulary(const std::string& dir) {
  const std::string encoder = dir + "/encoder.json", merges = dir + "/vocab.bpe";
  const json enc = parse_json(io::read_file(encoder), encoder);
  LOOM_CHECK(enc.is_object() && !enc.empty(), "export", encoder, ": expected an object of token -> id");
  ByteLevelVocabulary v;
  v.tokens.assign(enc.size(), "");
  v.types.assign(enc.size(), GgufTokenType::kNormal);
  for (const auto& [text, id] : enc.items()) {
    const int64_t i = id.get<int64_t>();
    LOOM_CHECK(i >= 0 && i < int64_t(enc.size()) && v.tokens[size_t(i)].empty(), "export", encoder, ": id ", i, " of '",
               text, "' is out of range or given twice");
    v.tokens[size_t(i)] = text;
  }
  const std::string text = io::read_file(merges);
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    if (!line.empty() && line.rfind("#version", 0) != 0) v.merges.push_back(line);
    pos = end + 1;
  }
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.tokens[i] == "<|endoftext|>") {
      v.types[i] = GgufTokenType::kControl;
      v.bos = v.eos = int32_t(i);
    }
  return v;
}

ByteLevelVocabulary byte_vocabulary() {
  ByteLevelVocabulary v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_level_char(uint8_t(b)));
  v.types.assign(256, GgufTokenType::kNormal);
  return v;
}

void pad_vocabulary(ByteLevelVocabulary& v, int64_t vocab_size) {
  LOOM_CHECK(int64_t(v.tokens.size()) <= vocab_size, "export", "the tokenizer has ", v.tokens.size(),
             " tokens but the model's vocabulary only ", vocab_size,
             "; the checkpoint's tokenizer is not the one it was trained with");
  for (int64_t id = int64_t(v.tokens.size()); id < vocab_size; ++id) {
    v.tokens.push_back(str_cat("[PAD", id, "]"));
    v.types.push_back(GgufTokenType::kUnused);
  }
}

}  // namespace loom::data
