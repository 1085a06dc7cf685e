// tokenizer.json -> PipelineSpec. Every component is checked against the list loom runs; an
// unknown type or option is an error naming the file, the component and the alternatives,
// never a silent approximation.
#include "loom/data/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/core/error.h"

namespace loom::data {
namespace {

using nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LOOM_CHECK(f.good(), "tokenizer", path, ": not found or unreadable; point at a tokenizer.json or its model folder");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Ctx {
  const std::string& where;
  [[noreturn]] void unsupported(const char* component, const std::string& type, const char* supported) const {
    fail("tokenizer", where, ": ", component, " type '", type, "' is not supported; loom runs ", supported);
  }
  std::string type_of(const json& j, const char* component) const {
    LOOM_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "tokenizer", where, ": ", component,
               " has no \"type\"; the file is not a tokenizer.json written by `tokenizers`");
    return j["type"].get<std::string>();
  }
  bool flag(const json& j, const char* key, bool fallback) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    LOOM_CHECK(j[key].is_boolean(), "tokenizer", where, ": \"", key, "\" must be true or false");
    return j[key].get<bool>();
  }
  std::string str(const json& j, const char* key) const {
    LOOM_CHECK(j.contains(key) && j[key].is_string(), "tokenizer", where, ": \"", key, "\" must be a string");
    return j[key].get<std::string>();
  }
  // A Replace/Split "pattern": {"String": s} or {"Regex": r}.
  std::pair<bool, std::string> pattern(const json& j) const {
    LOOM_CHECK(j.contains("pattern") && j["pattern"].is_object(), "tokenizer", where,
               ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
    const json& p = j["pattern"];
    if (p.contains("String")) return {false, p["String"].get<std::string>()};
    if (p.contains("Regex")) return {true, p["Regex"].get<std::string>()};
    fail("tokenizer", where, ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
  }
};

constexpr const char* kNormalizers = "NFC, Prepend, Replace (of a literal string) and Sequence";
constexpr const char* kPreTokenizers =
    "Split (GPT-2's, Llama 3's or Qwen2's regex, Isolated), Digits, ByteLevel, Metaspace and Sequence";
constexpr const char* kDecoders = "ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace and Sequence";

void parse_normalizer(const Ctx& c, const json& j, std::vector<NormalizerStep>& out) {
  if (j.is_null()) return;
  const std::string t = c.type_of(j, "normalizer");
  if (t == "Sequence") {
    for (const json& s : j.at("normalizers")) parse_normalizer(c, s, out);
  } else if (t == "NFC") {
    out.push_back({NormalizerStep::Kind::kNfc, "", ""});
  } else if (t == "Prepend") {
    out.push_back({NormalizerStep::Kind::kPrepend, "", c.str(j, "prepend")});
  } else if (t == "Replace") {
    auto [regex, pat] = c.pattern(j);
    if (regex)
      fail("tokenizer", c.where, ": normalizer Replace with regex '", pat,
           "' is not supported; loom replaces literal strings only");
    out.push_back({NormalizerStep::Kind::kReplace, pat, c.str(j, "content")});
  } else {
    c.unsupported("normalizer", t, kNormalizers);
  }
}

PrependScheme prepend_scheme(const Ctx& c, const json& j) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    fail("tokenizer", c.where, ": Metaspace prepend_scheme '", s, "' is not one of always, first, never");
  }
  return c.flag(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Ctx& c, const json& j, bool last) {
  const std::string t = c.type_of(j, "pre_tokenizer");
  if (t == "Sequence") {
    const json& list = j.at("pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(parse_pre_tokenizer(c, list[i], last && i + 1 == list.size()));
    return make_sequence_pretokenizer(std::move(steps));
  }
  if (t == "ByteLevel") {
    LOOM_CHECK(
        last, "tokenizer", c.where,
        ": pre_tokenizer ByteLevel followed by other pre-tokenizers is not supported; loom needs ByteLevel last");
    return make_byte_level_pretokenizer(c.flag(j, "add_prefix_space", true), c.flag(j, "use_regex", true));
  }
  if (t == "Digits") return make_digits_pretokenizer(c.flag(j, "individual_digits", false));
  if (t == "Metaspace") {
    const std::string rep = c.str(j, "replacement");
    return make_metaspace_pretokenizer(rep, prepend_scheme(c, j), c.flag(j, "split", true));
  }
  if (t == "Split") {
    auto [regex, pat] = c.pattern(j);
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    LOOM_CHECK(behavior == "Isolated" && !c.flag(j, "invert", false), "tokenizer", c.where,
               ": pre_tokenizer Split with behavior '", behavior, "'", c.flag(j, "invert", false) ? " and invert" : "",
               " is not supported; loom runs Isolated splits");
    const std::optional<SplitRegex> known = regex ? recognize_split_regex(pat) : std::nullopt;
    LOOM_CHECK(known.has_value(), "tokenizer", c.where, ": pre_tokenizer Split pattern '", pat,
               "' is not supported; loom matches GPT-2's, Llama 3's and Qwen2's regexes exactly as written in their "
               "tokenizer.json files, and no others");
    return make_split_pretokenizer(*known);
  }
  c.unsupported("pre_tokenizer", t, kPreTokenizers);
}

void parse_decoder(const Ctx& c, const json& j, std::vector<DecodeStep>& out) {
  using K = DecodeStep::Kind;
  const std::string t = c.type_of(j, "decoder");
  DecodeStep s;
  if (t == "Sequence") {
    for (const json& d : j.at("decoders")) parse_decoder(c, d, out);
    return;
  } else if (t == "ByteLevel") {
    s.kind = K::kByteLevel;
  } else if (t == "ByteFallback") {
    s.kind = K::kByteFallback;
  } else if (t == "Fuse") {
    s.kind = K::kFuse;
  } else if (t == "Metaspace") {
    s.kind = K::kMetaspace;
    s.content = c.str(j, "replacement");
    s.prepend = prepend_scheme(c, j) != PrependScheme::kNever;
  } else if (t == "Strip") {
    s.kind = K::kStrip;
    s.content = c.str(j, "content");
    s.start = j.value("start", size_t(0));
    s.stop = j.value("stop", size_t(0));
  } else if (t == "Replace") {
    auto [regex, pat] = c.pattern(j);
    if (regex)
      fail("tokenizer", c.where, ": decoder Replace with regex '", pat,
           "' is not supported; loom replaces literal strings only");
    s.kind = K::kReplace;
    s.pattern = pat;
    s.content = c.str(j, "content");
  } else {
    c.unsupported("decoder", t, kDecoders);
  }
  out.push_back(std::move(s));
}

// TemplateProcessing's "single" template: special tokens before and after sequence A.
void parse_post_processor(const Ctx& c, const json& j, PipelineSpec& spec) {
  if (j.is_null()) return;
  const std::string t = c.type_of(j, "post_processor");
  if (t == "Sequence") {
    for (const json& p : j.at("processors")) parse_post_processor(c, p, spec);
  } else if (t == "ByteLevel") {
    return;  // it only moves offsets
  } else if (t == "TemplateProcessing") {
    bool seen_a = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      LOOM_CHECK(item.contains("SpecialToken"), "tokenizer", c.where, ": TemplateProcessing item ", item.dump(),
                 " is neither a SpecialToken nor a Sequence");
      const std::string name = item["SpecialToken"].at("id").get<std::string>();
      const json& specials = j.at("special_tokens");
      LOOM_CHECK(specials.contains(name), "tokenizer", c.where, ": TemplateProcessing names '", name,
                 "' but its special_tokens does not define it");
      for (const json& id : specials[name].at("ids"))
        (seen_a ? spec.suffix_ids : spec.prefix_ids).push_back(id.get<int32_t>());
    }
  } else {
    c.unsupported("post_processor", t, "TemplateProcessing, ByteLevel and Sequence");
  }
}

std::unique_ptr<BpeModel> parse_model(const Ctx& c, const json& m, bool byte_level) {
  const std::string t = m.contains("type") ? m["type"].get<std::string>() : std::string("BPE");
  if (t != "BPE") c.unsupported("model", t, "BPE models");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    LOOM_CHECK(!m.contains(key) || m[key].is_null() || m[key] == "", "tokenizer", c.where, ": BPE ", key, " '",
               m[key].dump(), "' is not supported; loom runs BPE without subword affixes");
  }
  LOOM_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0, "tokenizer",
             c.where, ": BPE dropout is a training option; set \"dropout\": null to encode with loom");
  const json& vocab = m.at("vocab");
  LOOM_CHECK(vocab.is_object(), "tokenizer", c.where, ": model.vocab must be an object of token -> id");
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
  std::vector<std::string> tokens(size_t(max_id + 1));
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    LOOM_CHECK(id >= 0 && tokens[size_t(id)].empty(), "tokenizer", c.where, ": vocab id ", id, " of '", it.key(),
               "' is negative or given twice");
    tokens[size_t(id)] = it.key();
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const json& mj = m.at("merges");
  merges.reserve(mj.size());
  for (const json& e : mj) {
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      LOOM_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, "tokenizer", c.where, ": merge '",
                 s, "' is not two tokens separated by one space");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      LOOM_CHECK(e.is_array() && e.size() == 2, "tokenizer", c.where, ": merge ", e.dump(), " is not a pair");
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    }
  }
  BpeOptions o;
  o.byte_level = byte_level;
  o.byte_fallback = c.flag(m, "byte_fallback", false);
  o.ignore_merges = c.flag(m, "ignore_merges", false);
  o.fuse_unk = c.flag(m, "fuse_unk", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const std::string unk = m["unk_token"].get<std::string>();
    auto it = vocab.find(unk);
    LOOM_CHECK(it != vocab.end(), "tokenizer", c.where, ": unk_token '", unk, "' is not in the vocabulary");
    o.unk_id = it.value().get<int32_t>();
  }
  return std::make_unique<BpeModel>(std::move(tokens), merges, o, c.where);
}

}  // namespace

PipelineSpec parse_hf_tokenizer_json(const std::string& json_text, const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const std::exception& e) {
    fail("tokenizer", where, ": not valid JSON (", e.what(), "); download tokenizer.json again");
  }
  const Ctx c{where};
  LOOM_CHECK(j.is_object() && j.contains("model"), "tokenizer", where, ": no \"model\"; not a tokenizer.json");
  PipelineSpec spec;
  spec.name = where;
  try {
    std::vector<NormalizerStep> norm;
    parse_normalizer(c, j.value("normalizer", json()), norm);
    spec.normalizer = Normalizer(std::move(norm));
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
      spec.pre_tokenizer = parse_pre_tokenizer(c, j["pre_tokenizer"], true);
    const bool byte_level = spec.pre_tokenizer && spec.pre_tokenizer->byte_level();
    spec.model = parse_model(c, j["model"], byte_level);
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      parse_decoder(c, j["decoder"], spec.decoder);
    } else if (byte_level) {
      spec.decoder.push_back({DecodeStep::Kind::kByteLevel, "", "", 0, 0, true});
    }
    parse_post_processor(c, j.value("post_processor", json()), spec);
    for (const json& a : j.value("added_tokens", json::array())) {
      AddedToken t;
      t.id = a.at("id").get<int32_t>();
      t.content = a.at("content").get<std::string>();
      t.special = c.flag(a, "special", false);
      t.lstrip = c.flag(a, "lstrip", false);
      t.rstrip = c.flag(a, "rstrip", false);
      t.single_word = c.flag(a, "single_word", false);
      t.normalized = c.flag(a, "normalized", !t.special);
      if (!t.content.empty()) spec.added.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer", where, ": unexpected layout (", e.what(),
         "); the file is not a tokenizer.json `tokenizers` writes");
  }
  if (spec.prefix_ids.size() == 1) spec.bos = spec.prefix_ids[0];
  if (spec.suffix_ids.size() == 1) spec.eos = spec.suffix_ids[0];
  return spec;
}

std::unique_ptr<PipelineTokenizer> load_hf_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file = fs::is_directory(path) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  PipelineSpec spec = parse_hf_tokenizer_json(read_text(file.string()), file.string());
  const bool template_says = !spec.prefix_ids.empty() || !spec.suffix_ids.empty();
  auto id_of = [&](const std::string& text) -> std::optional<int32_t> {
    for (const AddedToken& t : spec.added)
      if (t.content == text) return t.id;
    return spec.model->find(text);
  };
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(config)) {
    json cfg;
    try {
      cfg = json::parse(read_text(config.string()));
    } catch (const std::exception& e) {
      fail("tokenizer", config.string(), ": not valid JSON (", e.what(), "); download it again or delete it");
    }
    // "bos_token" is a string or an AddedToken object with "content".
    auto token_of = [&](const char* key) -> std::optional<int32_t> {
      if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
      const json& v = cfg[key];
      const std::string text = v.is_string() ? v.get<std::string>() : v.value("content", std::string());
      std::optional<int32_t> id = id_of(text);
      LOOM_CHECK(id.has_value(), "tokenizer", config.string(), ": ", key, " '", text, "' is not in ", file.string(),
                 "'s vocabulary; the two files belong to different models");
      return id;
    };
    if (auto b = token_of("bos_token")) spec.bos = b;
    if (auto e = token_of("eos_token")) spec.eos = e;
    if (!template_says) {
      if (cfg.value("add_bos_token", false) && spec.bos) spec.prefix_ids = {*spec.bos};
      if (cfg.value("add_eos_token", false) && spec.eos) spec.suffix_ids = {*spec.eos};
    }
  }
  if (!spec.eos) {
    // Without tokenizer_config.json: the end-of-text names the common model families use.
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>"}) {
      if (auto id = id_of(name)) {
        spec.eos = id;
        break;
      }
    }
  }
  return std::make_unique<PipelineTokenizer>(std::move(spec));
}

}  // namespace loom::data
