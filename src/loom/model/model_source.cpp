#include "loom/model/model_source.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "loom/core/enum_names.h"
#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/gguf.h"
#include "loom/model/gguf_model.h"
#include "loom/model/hf_weights.h"

namespace loom::model {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const fs::path& p) {
  try {
    return json::parse(io::read_file(p.string()));
  } catch (const json::exception& e) {
    fail("hf", p.string(), ": not valid JSON (", e.what(), ")");
  }
}

// A special token as tokenizer_config.json writes it: a string, or {"content": ...}.
std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

void add_end_id(ModelCard& c, int64_t id) {
  if (id >= 0 && id < c.config.vocab_size &&
      std::find(c.end_ids.begin(), c.end_ids.end(), int32_t(id)) == c.end_ids.end())
    c.end_ids.push_back(int32_t(id));
}

ModelCard gguf_card(const std::string& path) {
  ModelCard c;
  c.gguf = std::make_shared<const io::GgufFile>(io::GgufFile::open(path));
  const io::GgufFile& g = *c.gguf;
  c.format = ModelFormat::gguf;
  c.config = gguf_model_config(g);
  c.name = fs::path(path).stem().string();  // what the user named, as vLLM and Ollama serve it
  c.tokenizer = path;
  c.chat_template = g.get_string("tokenizer.chat_template", "");
  c.chat_template_source = path + ":tokenizer.chat_template";
  // Two entries of the vocabulary, read where they are rather than copying all of it.
  const io::GgufValue* tokens = g.find("tokenizer.ggml.tokens");
  auto text_of = [&](const char* key) {
    const int64_t id = g.get_int(key, -1);
    const bool known = tokens && tokens->type == io::GgufType::array && id >= 0 && id < int64_t(tokens->items.size());
    return known ? tokens->items[size_t(id)].s : std::string();
  };
  c.bos_token = text_of("tokenizer.ggml.bos_token_id");
  c.eos_token = text_of("tokenizer.ggml.eos_token_id");
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    add_end_id(c, g.get_int(k, -1));
  return c;
}

// One id or a list of them (generation_config.json's eos_token_id).
void add_end_ids(ModelCard& c, const json& v) {
  if (v.is_number_integer()) add_end_id(c, v.get<int64_t>());
  if (v.is_array())
    for (const json& x : v)
      if (x.is_number_integer()) add_end_id(c, x.get<int64_t>());
}

ModelCard hf_card(const std::string& dir) {
  const fs::path d(dir);
  ModelCard c;
  c.format = ModelFormat::hf;
  const json cfg = read_json(d / "config.json");
  c.config = parse_hf_config(cfg.dump(), (d / "config.json").string());
  c.name = fs::path(fs::absolute(d).lexically_normal()).filename().string();
  if (c.name.empty()) c.name = fs::absolute(d).parent_path().filename().string();
  c.config.name = c.name;
  c.tokenizer = dir;
  read_chat_files(dir, c);
  if (cfg.contains("eos_token_id")) add_end_ids(c, cfg["eos_token_id"]);
  return c;
}

// The safetensors files of a Hugging Face directory: model.safetensors, or every shard the
// index names.
std::vector<std::string> hf_weight_files(const fs::path& d) {
  if (fs::exists(d / "model.safetensors")) return {(d / "model.safetensors").string()};
  const fs::path index = d / "model.safetensors.index.json";
  LOOM_CHECK(fs::exists(index), "hf", d.string(),
             " has neither model.safetensors nor model.safetensors.index.json; loom reads safetensors weights "
             "(convert pytorch_model.bin with transformers' save_pretrained(safe_serialization=True))");
  const json j = read_json(index);
  LOOM_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "hf", index.string(),
             ": no \"weight_map\" object");
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    LOOM_CHECK(file.is_string(), "hf", index.string(), ": weight_map[\"", name, "\"] is not a file name");
    const std::string f = file.get<std::string>();
    LOOM_CHECK(f.find('/') == std::string::npos && f.find("..") == std::string::npos, "hf", index.string(), ": shard '",
               f, "' is not a file name in the directory");
    shards.insert(f);
  }
  std::vector<std::string> out;
  for (const auto& f : shards) {
    LOOM_CHECK(fs::exists(d / f), "hf", index.string(), " names shard ", f, ", which is missing from ", d.string());
    out.push_back((d / f).string());
  }
  return out;
}

}  // namespace

void read_chat_files(const std::string& dir, ModelCard& c) {
  const fs::path d(dir);
  if (fs::exists(d / "tokenizer_config.json")) {
    const json tc = read_json(d / "tokenizer_config.json");
    if (tc.contains("bos_token")) c.bos_token = token_text(tc["bos_token"]);
    if (tc.contains("eos_token")) c.eos_token = token_text(tc["eos_token"]);
    if (tc.contains("chat_template")) {
      const json& t = tc["chat_template"];
      if (t.is_string()) {
        c.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // named templates: [{"name": "default", "template": ...}, ...]
        for (const json& item : t)
          if (item.value("name", "") == "default" && item.contains("template"))
            c.chat_template = item["template"].get<std::string>();
      }
      c.chat_template_source = (d / "tokenizer_config.json").string() + ":chat_template";
    }
  }
  if (c.chat_template.empty() && fs::exists(d / "chat_template.jinja")) {
    c.chat_template = io::read_file((d / "chat_template.jinja").string());
    c.chat_template_source = (d / "chat_template.jinja").string();
  }
  if (fs::exists(d / "generation_config.json")) {
    const json gc = read_json(d / "generation_config.json");
    if (gc.contains("eos_token_id")) add_end_ids(c, gc["eos_token_id"]);
  }
  if (!c.eos_token.empty() && std::find(c.end_tokens.begin(), c.end_tokens.end(), c.eos_token) == c.end_tokens.end())
    c.end_tokens.push_back(c.eos_token);
}

const char* model_format_name(ModelFormat f) {
  static constexpr EnumName<ModelFormat> kNames[] = {
      {ModelFormat::loom, "loom checkpoint"}, {ModelFormat::gguf, "GGUF"}, {ModelFormat::hf, "Hugging Face"}};
  return enum_name(kNames, f);
}

ModelFormat model_format(const std::string& path) {
  if (is_gguf_file(path)) return ModelFormat::gguf;
  const fs::path p(path);
  std::error_code ec;
  LOOM_CHECK(fs::exists(p, ec), "model", path,
             " does not exist (expected a .gguf file, a Hugging Face directory or a "
             "loom checkpoint)");
  LOOM_CHECK(fs::is_directory(p, ec), "model", path,
             " is a file but not a GGUF file (its first bytes are not \"GGUF\"); give a .gguf file, a Hugging Face "
             "directory or a loom checkpoint directory");
  if (fs::exists(p / "manifest.json")) return ModelFormat::loom;
  if (fs::exists(p / "config.json")) return ModelFormat::hf;
  return ModelFormat::loom;  // a run directory: resolve_checkpoint finds its newest checkpoint or says why not
}

ModelCard read_model_card(const std::string& path) {
  switch (model_format(path)) {
    case ModelFormat::gguf: return gguf_card(path);
    case ModelFormat::hf: return hf_card(path);
    case ModelFormat::loom: break;
  }
  fail("model", path, " is a loom checkpoint; its card is read by checkpoint_reader.h");
}

std::vector<CardFile> read_tokenizer_files(const std::string& dir) {
  std::vector<CardFile> files;
  for (const char* f : io::kTokenizerFiles)
    if (fs::exists(fs::path(dir) / f)) files.push_back({f, io::read_file((fs::path(dir) / f).string())});
  return files;
}

TokenizerFiles tokenizer_files(const std::string& source, const ModelCard& card) {
  TokenizerFiles out;
  if (card.format == ModelFormat::hf) {
    out.files = read_tokenizer_files(source);
    out.tokenizer = ".";
    return out;
  }
  LOOM_CHECK(card.format == ModelFormat::gguf, "model", source, ": tokenizer_files reads GGUF and Hugging Face cards");
  std::optional<io::GgufFile> opened;
  const io::GgufFile& g = card.gguf ? *card.gguf : opened.emplace(io::GgufFile::open(source));
  if (!g.has("tokenizer.ggml.model")) {
    out.tokenizer = fs::absolute(source).string();
    return out;
  }
  io::GgufWriter w;
  w.set("general.architecture", g.value("general.architecture"));
  w.set("general.name", io::gguf_string(card.name));
  for (const auto& [key, value] : g.metadata())
    if (key.rfind("tokenizer.", 0) == 0) w.set(key, value);
  out.files.push_back({"tokenizer.gguf", w.bytes()});
  nlohmann::json tc = nlohmann::json::object();
  if (!card.chat_template.empty()) tc["chat_template"] = card.chat_template;
  if (!card.bos_token.empty()) tc["bos_token"] = card.bos_token;
  if (!card.eos_token.empty()) tc["eos_token"] = card.eos_token;
  out.files.push_back({"tokenizer_config.json", tc.dump(2)});
  if (!card.end_ids.empty())
    out.files.push_back({"generation_config.json", nlohmann::json({{"eos_token_id", card.end_ids}}).dump(2)});
  out.tokenizer = "tokenizer.gguf";
  return out;
}

std::string load_model_weights(const std::string& path, const ModelCard& card, Decoder& m) {
  Stopwatch sw;
  if (card.format == ModelFormat::gguf) {
    std::optional<io::GgufFile> opened;  // a card made by hand has no file open
    const io::GgufFile& g = card.gguf ? *card.gguf : opened.emplace(io::GgufFile::open(path));
    const GgufLoadReport r = load_gguf_weights(g, m);
    return str_cat(r.describe(), " in ", std::round(sw.seconds() * 100) / 100, " s");
  }
  LOOM_CHECK(card.format == ModelFormat::hf, "model", path,
             " is a loom checkpoint; read it with read_checkpoint_weights");
  const std::vector<std::string> files = hf_weight_files(path);
  load_hf_safetensors(m.config(), m.layout(), m.params(), files);
  return str_cat(files.size(), " safetensors file", files.size() == 1 ? "" : "s", " in ",
                 std::round(sw.seconds() * 100) / 100, " s");
}

}  // namespace loom::model
