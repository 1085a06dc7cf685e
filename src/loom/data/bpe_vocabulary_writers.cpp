// Writing a byte-level BPE vocabulary (bpe_vocabulary.h) as a tokenizer.json and as GGUF
// tokenizer.ggml.* keys: each the layout loom's reader of that form (hf_tokenizer.cpp,
// gguf_tokenizer.cpp) turns into the same pipeline, and the layout `tokenizers` and llama.cpp's
// converter write for these pre-tokenizers.
#include <map>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/data/bpe_vocabulary.h"
#include "loom/data/pretokenizers.h"
#include "loom/io/gguf.h"

namespace loom::data {

using ojson = nlohmann::ordered_json;

namespace {

bool added(GgufTokenType t) { return t == GgufTokenType::kControl || t == GgufTokenType::kUserDefined; }

ojson byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

ojson pre_tokenizer_json(BytePreTokenizer p) {
  auto split = [](SplitRegex r) {
    return ojson{{"type", "Split"},
                 {"pattern", {{"Regex", std::string(split_regex_pattern(r))}}},
                 {"behavior", "Isolated"},
                 {"invert", false}};
  };
  auto sequence = [](ojson a, ojson b) {
    return ojson{{"type", "Sequence"}, {"pretokenizers", ojson::array({std::move(a), std::move(b)})}};
  };
  switch (p) {
    case BytePreTokenizer::gpt2: return byte_level(true);
    case BytePreTokenizer::smollm: return sequence({{"type", "Digits"}, {"individual_digits", true}}, byte_level(true));
    case BytePreTokenizer::llama3: return sequence(split(SplitRegex::kLlama3), byte_level(false));
    case BytePreTokenizer::qwen2: return sequence(split(SplitRegex::kQwen2), byte_level(false));
  }
  return byte_level(true);
}

// TemplateProcessing that puts BOS before and EOS after each sequence (where the vocabulary adds
// them), as Llama 3's tokenizer.json does; null when it adds neither.
ojson post_processor_json(const ByteLevelVocabulary& v) {
  if (!v.add_bos && !v.add_eos) return nullptr;
  ojson special = ojson::object();
  auto token = [&](int32_t id, int type_id) {
    const std::string& text = v.tokens[size_t(id)];
    special[text] = {{"id", text}, {"ids", {id}}, {"tokens", {text}}};
    return ojson{{"SpecialToken", {{"id", text}, {"type_id", type_id}}}};
  };
  auto sequence = [&](const char* name, int type_id, ojson& out) {
    if (v.add_bos) out.push_back(token(*v.bos, type_id));
    out.push_back({{"Sequence", {{"id", name}, {"type_id", type_id}}}});
    if (v.add_eos) out.push_back(token(*v.eos, type_id));
  };
  ojson single = ojson::array();
  sequence("A", 0, single);
  ojson pair = single;
  sequence("B", 1, pair);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", special}};
}

// token -> id for the BPE model: every token once. An added token whose text a BPE token has too
// stays in added_tokens only; two BPE tokens of one text cannot be said in tokenizer.json.
ojson vocab_json(const ByteLevelVocabulary& v) {
  std::map<std::string, size_t> seen;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    auto [it, fresh] = seen.emplace(v.tokens[id], id);
    if (fresh) continue;
    const size_t other = it->second;
    if (added(v.types[id])) continue;
    LOOM_CHECK(added(v.types[other]), "export", "the vocabulary holds '", v.tokens[id], "' at ids ", other, " and ", id,
               "; a tokenizer.json vocabulary maps each text to one id");
    it->second = id;
  }
  ojson vocab = ojson::object();
  for (size_t id = 0; id < v.tokens.size(); ++id)
    if (seen[v.tokens[id]] == id) vocab[v.tokens[id]] = id;
  return vocab;
}

}  // namespace

std::string tokenizer_json(const ByteLevelVocabulary& v) {
  LOOM_CHECK(v.types.size() == v.tokens.size(), "export", "vocabulary of ", v.tokens.size(), " tokens has ",
             v.types.size(), " token types");
  ojson added_tokens = ojson::array();
  for (size_t id = 0; id < v.tokens.size(); ++id)
    if (added(v.types[id]))
      added_tokens.push_back({{"id", id},
                              {"content", v.tokens[id]},
                              {"single_word", false},
                              {"lstrip", false},
                              {"rstrip", false},
                              {"normalized", false},
                              {"special", v.types[id] == GgufTokenType::kControl}});
  ojson merges = ojson::array();
  for (const std::string& m : v.merges) merges.push_back(m);
  const ojson j = {{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added_tokens},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", pre_tokenizer_json(v.pre)},
                   {"post_processor", post_processor_json(v)},
                   {"decoder", byte_level(true)},
                   {"model",
                    {{"type", "BPE"},
                     {"dropout", nullptr},
                     {"unk_token", nullptr},
                     {"continuing_subword_prefix", nullptr},
                     {"end_of_word_suffix", nullptr},
                     {"fuse_unk", false},
                     {"byte_fallback", false},
                     {"ignore_merges", v.pre == BytePreTokenizer::llama3},
                     {"vocab", vocab_json(v)},
                     {"merges", merges}}}};
  return j.dump(1) + "\n";
}

void set_gguf_vocabulary(const ByteLevelVocabulary& v, io::GgufWriter& w) {
  std::vector<io::GgufValue> types;
  types.reserve(v.types.size());
  for (GgufTokenType t : v.types) types.push_back(io::gguf_int(int32_t(t)));
  w.set("tokenizer.ggml.model", io::gguf_string("gpt2"));
  w.set("tokenizer.ggml.pre", io::gguf_string(gguf_pre_name(v.pre)));
  w.set("tokenizer.ggml.tokens", io::gguf_strings(v.tokens));
  w.set("tokenizer.ggml.token_type", io::gguf_array(io::GgufType::i32, std::move(types)));
  w.set("tokenizer.ggml.merges", io::gguf_strings(v.merges));
  const std::pair<const char*, std::optional<int32_t>> ids[] = {{"tokenizer.ggml.bos_token_id", v.bos},
                                                                {"tokenizer.ggml.eos_token_id", v.eos},
                                                                {"tokenizer.ggml.unknown_token_id", v.unk},
                                                                {"tokenizer.ggml.padding_token_id", v.pad}};
  for (const auto& [key, id] : ids)
    if (id) w.set(key, io::gguf_uint(uint32_t(*id)));
  w.set("tokenizer.ggml.add_bos_token", io::gguf_bool(v.add_bos));
  w.set("tokenizer.ggml.add_eos_token", io::gguf_bool(v.add_eos));
}

}  // namespace loom::data
