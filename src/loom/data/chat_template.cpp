// ChatTemplate: parse once at load, render per request (see chat_template.h).
#include "loom/data/chat_template.h"

#include <stdexcept>

#include "loom/core/error.h"
#include "loom/data/jinja_ast.h"
#include "loom/data/jinja_render.h"

namespace loom::data {

ChatTemplate::ChatTemplate(std::string source, std::string name)
    : name_(std::move(name)), program_(jinja::parse_template(source, name_)) {}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& vars, const ChatTemplateOptions& opt) const {
  LOOM_CHECK(vars.is_object(), "chat-template", name_, ": render() needs a JSON object of variables, got ",
             vars.type_name());
  try {
    jinja::Renderer r(*program_, opt);
    return r.run(jinja::from_json(vars));
  } catch (const std::length_error& e) {  // a value nested too deep (jinja_value.h)
    fail("chat-template", name_, ": ", e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::json& vars, const ChatTemplateOptions& opt) const {
  return render(nlohmann::ordered_json::parse(vars.dump()), opt);
}

}  // namespace loom::data
