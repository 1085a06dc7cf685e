// How /v1/chat/completions (and `loom generate --chat`, `loom chat`) turn messages into one
// prompt: the model's own chat template (a Jinja program from its GGUF or tokenizer_config.json,
// run by data/chat_template.h), or ChatML for models that bring none (loom's own checkpoints;
// documented in docs/SERVING.md).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/serve/openai_request.h"

namespace loom::data {
class ChatTemplate;
}

namespace loom::serve {

inline constexpr const char* kChatTurnEnd = "<|im_end|>";

// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then (add_generation_prompt)
// "<|im_start|>assistant\n".
std::string render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true);

class ChatFormat {
 public:
  // ChatML as plain text: a loom model's tokenizer has no special tokens, so generation stops at
  // the text "<|im_end|>".
  static std::shared_ptr<const ChatFormat> chatml();
  // A model's template with its BOS and EOS texts; a template that does not parse, or uses
  // what the interpreter lacks, throws here naming `source_name`.
  static std::shared_ptr<const ChatFormat> from_template(const std::string& source, const std::string& source_name,
                                                         const std::string& bos_token, const std::string& eos_token);
  // A model's format: its template, or ChatML when it has none (`source` empty).
  static std::shared_ptr<const ChatFormat> for_model(const std::string& source, const std::string& source_name,
                                                     const std::string& bos_token, const std::string& eos_token);
  ~ChatFormat();

  // The prompt. `extra` holds more template variables (tools, documents, ...), an object or null.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                     const nlohmann::json& extra = nullptr) const;
  // Whether the prompt's special-token texts stand for those tokens (encode it with
  // TextTokenizer::encode_special): true for a model's own template.
  bool special_tokens() const { return tmpl_ != nullptr; }
  // Text that ends a reply besides the end tokens (ChatML's "<|im_end|>").
  const std::vector<std::string>& stop_strings() const { return stops_; }
  std::string describe() const;  // "ChatML", "the model's template (PATH:tokenizer.chat_template)"

 private:
  ChatFormat() = default;
  std::unique_ptr<data::ChatTemplate> tmpl_;
  std::string source_name_, bos_, eos_;
  std::vector<std::string> stops_;
};

}  // namespace loom::serve
