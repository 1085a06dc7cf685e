// `loom chat-template`: renders a conversation through a model's chat template (or a template
// file) and prints the prompt exactly as transformers' apply_chat_template(tokenize=False) does,
// or with --ids its token ids. For looking at prompts and checking templates; generation is
// `loom generate` / `loom chat`'s.
#include <time.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/data/chat_template.h"
#include "loom/data/tokenizer.h"
#include "loom/model/model_source.h"
#include "tools/loom/commands.h"

namespace loom::cli {
namespace {

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  LOOM_CHECK(f.good(), "chat-template", "cannot read ", what, " ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// FILE.json: a list of messages, or an object of the template's variables with "messages"
// among them. Key order is kept (ordered_json) because templates iterate over objects in it.
nlohmann::ordered_json read_variables(const std::string& path) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(read_file(path, "--messages file"));
  } catch (const nlohmann::json::exception& e) {
    fail("chat-template", path, " is not JSON: ", e.what());
  }
  if (j.is_array()) return nlohmann::ordered_json{{"messages", std::move(j)}};
  LOOM_CHECK(j.is_object() && j.contains("messages") && j["messages"].is_array(), "chat-template", path,
             " must hold a list of messages or an object with a \"messages\" list (and any other "
             "variables the template reads, such as \"tools\")");
  return j;
}

std::tm parse_now(const std::string& text) {
  std::tm tm{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%d %H:%M:%S", &tm);
  if (!rest || *rest) throw UsageError("[chat-template] --now \"" + text + "\": expected \"YYYY-MM-DD HH:MM:SS\"");
  std::tm normalized = tm;
  normalized.tm_isdst = -1;
  std::mktime(&normalized);  // fills in the weekday and day of the year that %A or %j print
  return normalized;
}

}  // namespace

int cmd_chat_template(const std::vector<std::string>& argv) {
  auto app = new_app("chat-template",
                     "Prints the prompt a chat template makes of a conversation, byte for byte as "
                     "transformers' apply_chat_template(tokenize=False) renders it (no newline added), or "
                     "with --ids its token ids on one line.");
  std::string model, template_path, messages_path, tokenizer_spec, now, bos_token, eos_token;
  bool no_generation_prompt = false, ids = false;
  app->add_option("--model", model, "a GGUF file or a Hugging Face folder: its template, BOS/EOS texts and tokenizer")
      ->type_name("PATH");
  app->add_option("--template", template_path, "a Jinja chat template file (instead of the model's)")
      ->type_name("FILE");
  app->add_option("--messages", messages_path,
                  "JSON: a list of {\"role\", \"content\"} messages, or an object with \"messages\" and any "
                  "other variables (\"tools\", \"add_generation_prompt\", ...), passed through in order")
      ->type_name("FILE.json")
      ->required();
  auto* bos_opt =
      app->add_option("--bos-token", bos_token, "the template's bos_token (default: the model's)")->type_name("TEXT");
  auto* eos_opt =
      app->add_option("--eos-token", eos_token, "the template's eos_token (default: the model's)")->type_name("TEXT");
  app->add_flag("--no-generation-prompt", no_generation_prompt,
                "add_generation_prompt=false (default true, or the messages file's value)");
  app->add_flag("--ids", ids,
                "print token ids instead of text: the rendered prompt with special-token texts as their ids and "
                "no BOS added, as apply_chat_template(tokenize=True) encodes it");
  app->add_option("--tokenizer", tokenizer_spec, "for --ids without --model: a tokenizer spec (a path, gpt2, byte)")
      ->type_name("SPEC");
  app->add_option("--now", now, "the time strftime_now() formats, \"YYYY-MM-DD HH:MM:SS\" (default: the clock)")
      ->type_name("TIME");
  if (auto rc = parse(*app, argv)) return *rc;
  if (model.empty() && template_path.empty())
    throw UsageError("[chat-template] pass --model PATH (its template) or --template FILE");
  if (ids && model.empty() && tokenizer_spec.empty())
    throw UsageError("[chat-template] --ids needs a tokenizer: pass --model PATH or --tokenizer SPEC");
  if (!model.empty() && !tokenizer_spec.empty())
    throw UsageError("[chat-template] --tokenizer and --model both name a tokenizer; pass one");
  data::ChatTemplateOptions opt;
  if (!now.empty()) opt.now = parse_now(now);

  // The template's variables in transformers' precedence: the tokenizer's special tokens, then
  // what the caller passes (here the messages file) over them.
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  std::string source, name;
  if (!model.empty()) {
    const model::ModelCard card = model::read_model_card(model);
    if (!card.bos_token.empty()) vars["bos_token"] = card.bos_token;
    if (!card.eos_token.empty()) vars["eos_token"] = card.eos_token;
    if (template_path.empty()) {
      LOOM_CHECK(!card.chat_template.empty(), "chat-template", model,
                 " carries no chat template; pass --template FILE");
      source = card.chat_template;
      name = card.chat_template_source.empty() ? model : card.chat_template_source;
    }
    tokenizer_spec = card.tokenizer;
  }
  if (!template_path.empty()) {
    source = read_file(template_path, "--template");
    name = template_path;
  }
  if (bos_opt->count()) vars["bos_token"] = bos_token;  // "" too: a template may test it
  if (eos_opt->count()) vars["eos_token"] = eos_token;
  const nlohmann::ordered_json from_file = read_variables(messages_path);
  for (const auto& [key, value] : from_file.items()) vars[key] = value;
  if (no_generation_prompt || !vars.contains("add_generation_prompt"))
    vars["add_generation_prompt"] = !no_generation_prompt;

  const std::string prompt = data::ChatTemplate(std::move(source), name).render(vars, opt);
  if (!ids) {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    return 0;
  }
  const std::vector<int32_t> out_ids = data::make_tokenizer(tokenizer_spec)->encode_special(prompt);
  std::string line;
  for (size_t i = 0; i < out_ids.size(); ++i) line += (i ? " " : "") + std::to_string(out_ids[i]);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

}  // namespace loom::cli
