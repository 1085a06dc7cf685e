// Chat templates: the Jinja programs that Hugging Face tokenizers (and GGUF files) carry to turn a
// list of messages into one prompt, rendered with transformers' `apply_chat_template` semantics
// (trim_blocks, lstrip_blocks, loop controls, an immutable sandbox, `raise_exception`,
// `strftime_now`, a `tojson` filter equal to Python's json.dumps(ensure_ascii=False)).
// Not a general Jinja engine: no includes, inheritance, imports or autoescaping.
#pragma once
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace loom::data {

struct ChatTemplateOptions {
  // The local time that `strftime_now(fmt)` formats; unset means the clock's local time now.
  // Tests and golden files pin it so that rendering is reproducible.
  std::optional<std::tm> now;
  // Bytes of output after which rendering stops with an error (a guard against runaway loops).
  size_t max_output_bytes = size_t(64) << 20;
  // Statements executed after which rendering stops with an error (loops that print nothing).
  size_t max_steps = size_t(20) << 20;
};

namespace jinja {
struct Template;  // the parsed program (jinja_ast.h)
}

class ChatTemplate {
 public:
  // Parses `source`; `name` names it in errors (a file path, or "<gguf>:tokenizer.chat_template").
  // Syntax errors and constructs this interpreter does not support fail here, with the line:
  // "[chat-template] NAME:12: unsupported filter 'xyz' ...".
  ChatTemplate(std::string source, std::string name);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with the keys of `vars` (an object) as the template's top-level variables: messages,
  // add_generation_prompt, bos_token, eos_token, tools, documents, anything else. Object keys keep
  // the order they have in `vars`, as Python dicts do. `raise_exception("msg")` in the template
  // throws loom::Error "[chat-template] NAME: the template raised: msg"; other run-time faults
  // (an undefined value used in arithmetic, a bad index type) throw "[chat-template] NAME:LINE: ...".
  std::string render(const nlohmann::ordered_json& vars, const ChatTemplateOptions& opt = {}) const;
  std::string render(const nlohmann::json& vars, const ChatTemplateOptions& opt = {}) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::unique_ptr<jinja::Template> program_;
};

}  // namespace loom::data
