// Which form a checkpoint's tokenizer is in, and how each goes out (tokenizer_export.h): Hugging
// Face files copied, or written from a byte-level vocabulary (bpe_vocabulary.h); a GGUF's keys
// copied, or written from the vocabulary.
#include "loom/data/tokenizer_export.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/data/bpe_vocabulary.h"
#include "loom/data/hf_tokenizer.h"
#include "loom/data/tokenizer.h"
#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/gguf.h"

namespace loom::data {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

enum class Kind { gguf, hf, gpt2, byte };
struct Source {
  Kind kind = Kind::byte;
  fs::path path;  // the GGUF, the tokenizer.json, or GPT-2's folder
};

Source source_of(const std::string& spec) {
  if (spec == "byte") return {Kind::byte, {}};
  if (spec == "gpt2") {
    const fs::path root = default_data_dir();
    const fs::path dir = fs::exists(root / "encoder.json") ? root : root / "gpt2";
    LOOM_CHECK(fs::exists(dir / "encoder.json") && fs::exists(dir / "vocab.bpe"), "export",
               "the gpt2 tokenizer's files (encoder.json, vocab.bpe) are not in ", dir.string(),
               "; set LOOM_DATA_DIR to the folder holding gpt2/");
    return {Kind::gpt2, dir};
  }
  std::error_code ec;
  const fs::path p = fs::absolute(spec, ec).lexically_normal();
  if (fs::is_directory(p, ec)) {
    LOOM_CHECK(fs::exists(p / "tokenizer.json"), "export", "the checkpoint's tokenizer ", p.string(),
               " holds no tokenizer.json; put the model's tokenizer files there");
    return {Kind::hf, p / "tokenizer.json"};
  }
  LOOM_CHECK(fs::is_regular_file(p, ec), "export", "the checkpoint's tokenizer ", spec,
             " does not exist (trainer_state.json names it); restore it, or edit \"tokenizer\" there");
  if (p.extension() == ".gguf") return {Kind::gguf, p};
  LOOM_CHECK(p.extension() == ".json", "export", "the checkpoint's tokenizer ", p.string(),
             " is neither a .gguf file nor a tokenizer.json");
  return {Kind::hf, p};
}

std::string read_if_exists(const fs::path& p) { return fs::exists(p) ? io::read_file(p.string()) : std::string(); }

ByteLevelVocabulary vocabulary_of(const Source& s, std::string* how) {
  switch (s.kind) {
    case Kind::byte: *how = "loom's byte tokenizer"; return byte_vocabulary();
    case Kind::gpt2: *how = "GPT-2's (" + s.path.string() + ")"; return gpt2_vocabulary(s.path.string());
    case Kind::gguf: {
      const io::GgufFile g = io::GgufFile::open(s.path.string());
      ByteLevelVocabulary v = vocabulary_from_gguf(g);
      *how = str_cat(s.path.filename().string(), "'s vocabulary (", gguf_pre_name(v.pre), ")");
      return v;
    }
    case Kind::hf: break;
  }
  ByteLevelVocabulary v = vocabulary_from_tokenizer_json(
      io::read_file(s.path.string()), read_if_exists(s.path.parent_path() / "tokenizer_config.json"), s.path.string());
  *how = str_cat(s.path.string(), " (", gguf_pre_name(v.pre), ")");
  return v;
}

// A GGUF's chat template and end ids fill what the checkpoint's files leave empty.
ChatCard with_gguf_card(ChatCard card, const Source& s) {
  if (s.kind != Kind::gguf) return card;
  const io::GgufFile g = io::GgufFile::open(s.path.string());
  if (card.chat_template.empty()) card.chat_template = g.get_string("tokenizer.chat_template", "");
  if (card.end_ids.empty())
    for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
      if (const int64_t id = g.get_int(k, -1); id >= 0) card.end_ids.push_back(int32_t(id));
  return card;
}

std::optional<int32_t> id_of(const ByteLevelVocabulary& v, const std::string& text) {
  for (size_t i = 0; !text.empty() && i < v.tokens.size(); ++i)
    if (v.tokens[i] == text) return int32_t(i);
  return std::nullopt;
}

// tokenizer_config.json and generation_config.json for a tokenizer.json written from `v`.
void add_config_files(const ByteLevelVocabulary& v, const ChatCard& card, int64_t n_ctx, ExportedTokenizer& out) {
  ojson tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"add_bos_token", v.add_bos},
              {"add_eos_token", v.add_eos},
              {"clean_up_tokenization_spaces", false},
              {"model_max_length", n_ctx}};
  const std::pair<const char*, std::optional<int32_t>> special[] = {
      {"bos_token", out.bos_id}, {"eos_token", out.eos_id}, {"unk_token", v.unk}, {"pad_token", v.pad}};
  for (const auto& [key, id] : special)
    if (id) tc[key] = v.tokens[size_t(*id)];
  if (!card.chat_template.empty()) tc["chat_template"] = card.chat_template;
  out.files.push_back({"tokenizer_config.json", tc.dump(2) + "\n"});
  ojson gc = ojson::object();
  if (out.bos_id) gc["bos_token_id"] = *out.bos_id;
  std::vector<int32_t> ends = card.end_ids;
  if (ends.empty() && out.eos_id) ends.push_back(*out.eos_id);
  if (ends.size() == 1) gc["eos_token_id"] = ends[0];
  if (ends.size() > 1) gc["eos_token_id"] = ends;
  out.files.push_back({"generation_config.json", gc.dump(2) + "\n"});
}

// A GGUF's tokenizer.* keys as they are, with unused tokens up to vocab_size.
void copy_gguf_keys(const io::GgufFile& g, int64_t vocab_size, io::GgufWriter& w) {
  const int64_t n = int64_t(g.get_strings("tokenizer.ggml.tokens").size());
  LOOM_CHECK(n <= vocab_size, "export", g.path(), " has ", n, " tokens but the model's vocabulary only ", vocab_size,
             "; the checkpoint's tokenizer is not the one it was trained with");
  for (const auto& [key, value] : g.metadata()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    io::GgufValue v = value;
    const bool per_token =
        key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.token_type" || key == "tokenizer.ggml.scores";
    for (int64_t id = n; per_token && id < vocab_size; ++id) {
      if (key == "tokenizer.ggml.tokens") v.items.push_back(io::gguf_string(str_cat("[PAD", id, "]")));
      if (key == "tokenizer.ggml.token_type")
        v.items.push_back(io::gguf_int(int32_t(GgufTokenType::kUnused), v.elem_type));
      if (key == "tokenizer.ggml.scores") v.items.push_back(io::gguf_float(0.0, v.elem_type));
    }
    w.set(key, std::move(v));
  }
}

}  // namespace

ExportedTokenizer hf_tokenizer_files(const std::string& spec, const ChatCard& card, int64_t vocab_size, int64_t n_ctx) {
  const Source s = source_of(spec);
  ExportedTokenizer out;
  if (s.kind == Kind::hf) {
    // The model's own files, as they are; a tokenizer.json under another name goes in as tokenizer.json.
    const fs::path dir = s.path.parent_path();
    out.files.push_back({"tokenizer.json", io::read_file(s.path.string())});
    std::string names = "tokenizer.json";
    for (const char* f : io::kTokenizerFiles) {
      const std::string name = f;
      if (name == "tokenizer.json" || name == "tokenizer.gguf" || s.path.filename() != "tokenizer.json" ||
          !fs::exists(dir / name))
        continue;
      out.files.push_back({name, io::read_file((dir / name).string())});
      names += ", " + name;
    }
    const auto tok = load_hf_tokenizer(s.path.string());
    LOOM_CHECK(tok->vocab_size() <= vocab_size, "export", s.path.string(), " has ", tok->vocab_size(),
               " tokens but the model's vocabulary only ", vocab_size,
               "; the checkpoint's tokenizer is not the one it was trained with");
    out.bos_id = tok->bos_id();
    out.eos_id = tok->eos_id();
    out.how = str_cat("copied from ", dir.string(), ": ", names);
    return out;
  }
  std::string from;
  const ByteLevelVocabulary v = vocabulary_of(s, &from);
  LOOM_CHECK(int64_t(v.tokens.size()) <= vocab_size, "export", "the tokenizer (", from, ") has ", v.tokens.size(),
             " tokens but the model's vocabulary only ", vocab_size,
             "; the checkpoint's tokenizer is not the one it was trained with");
  const ChatCard c = with_gguf_card(card, s);
  out.bos_id = v.bos ? v.bos : id_of(v, c.bos_token);
  out.eos_id = id_of(v, c.eos_token) ? id_of(v, c.eos_token) : v.eos;
  out.files.push_back({"tokenizer.json", tokenizer_json(v)});
  add_config_files(v, c, n_ctx, out);
  out.notes = v.notes;
  out.how = "tokenizer.json written from " + from;
  return out;
}

ExportedTokenizer set_gguf_tokenizer(const std::string& spec, const ChatCard& card, int64_t vocab_size,
                                     io::GgufWriter& w) {
  const Source s = source_of(spec);
  ExportedTokenizer out;
  std::optional<int32_t> eos;
  if (s.kind == Kind::gguf) {
    const io::GgufFile g = io::GgufFile::open(s.path.string());
    LOOM_CHECK(g.has("tokenizer.ggml.model"), "export", s.path.string(), " carries no tokenizer (no tokenizer.ggml.*)");
    copy_gguf_keys(g, vocab_size, w);
    if (const int64_t e = g.get_int("tokenizer.ggml.eos_token_id", -1); e >= 0) eos = int32_t(e);
    out.how = str_cat("tokenizer.* keys of ", s.path.filename().string(), " (", g.get_string("tokenizer.ggml.model"),
                      ", ", g.get_string("tokenizer.ggml.pre", "no pre-tokenizer"), ")");
  } else {
    std::string from;
    ByteLevelVocabulary v = vocabulary_of(s, &from);
    pad_vocabulary(v, vocab_size);
    if (const auto e = id_of(v, card.eos_token)) v.eos = e;
    if (!v.bos) v.bos = id_of(v, card.bos_token);
    set_gguf_vocabulary(v, w);
    eos = v.eos;
    out.notes = v.notes;
    out.how = "tokenizer.ggml.* written from " + from;
  }
  if (!card.chat_template.empty()) w.set("tokenizer.chat_template", io::gguf_string(card.chat_template));
  // End ids beyond eos (Llama 3's <|eom_id|>, <|eot_id|>) as the keys llama.cpp and loom stop on.
  const char* more[] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  size_t k = 0;
  for (int32_t id : card.end_ids)
    if (id != eos && id < vocab_size && k < 2) w.set(more[k++], io::gguf_uint(uint32_t(id)));
  return out;
}

}  // namespace loom::data
