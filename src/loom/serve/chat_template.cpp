#include "loom/serve/chat_template.h"

#include "loom/core/error.h"
#include "loom/data/chat_template.h"
#include "loom/serve/engine_api.h"

namespace loom::serve {

std::string render_chat(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + kChatTurnEnd + "\n";
  return add_generation_prompt ? out + "<|im_start|>assistant\n" : out;
}

ChatFormat::~ChatFormat() = default;

std::shared_ptr<const ChatFormat> Engine::chat_format() const { return ChatFormat::chatml(); }

std::shared_ptr<const ChatFormat> ChatFormat::chatml() {
  static const std::shared_ptr<const ChatFormat> f = [] {
    std::shared_ptr<ChatFormat> c(new ChatFormat());
    c->stops_ = {kChatTurnEnd};
    return c;
  }();
  return f;
}

std::shared_ptr<const ChatFormat> ChatFormat::from_template(const std::string& source, const std::string& source_name,
                                                            const std::string& bos_token,
                                                            const std::string& eos_token) {
  std::shared_ptr<ChatFormat> c(new ChatFormat());
  c->tmpl_ = std::make_unique<data::ChatTemplate>(source, source_name);
  c->source_name_ = source_name;
  c->bos_ = bos_token;
  c->eos_ = eos_token;
  return c;
}

std::shared_ptr<const ChatFormat> ChatFormat::for_model(const std::string& source, const std::string& source_name,
                                                        const std::string& bos_token, const std::string& eos_token) {
  return source.empty() ? chatml() : from_template(source, source_name, bos_token, eos_token);
}

std::string ChatFormat::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                               const nlohmann::json& extra) const {
  if (!tmpl_) return render_chat(messages, add_generation_prompt);
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  vars["messages"] = std::move(list);
  vars["add_generation_prompt"] = add_generation_prompt;
  vars["bos_token"] = bos_;
  vars["eos_token"] = eos_;
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) vars[k] = nlohmann::ordered_json::parse(v.dump());
  return tmpl_->render(vars);
}

std::string ChatFormat::describe() const {
  return tmpl_ ? str_cat("the model's template (", source_name_, ")") : "ChatML";
}

}  // namespace loom::serve
