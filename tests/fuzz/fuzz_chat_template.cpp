// libFuzzer target: arbitrary bytes as a chat template, parsed and rendered with a small
// conversation as apply_chat_template would pass it. Bad templates must be refused with
// "[chat-template] ..." (any other exception, a crash or a hang is a bug); output and work are
// bounded by ChatTemplateOptions, so a render always ends.
#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/core/error.h"
#include "loom/data/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Héllo \"there\"\n"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call12345", "type": "function", "function": {"name": "f", "arguments": {"x": [1, 2.5, null]}}}]},
      {"role": "tool", "content": "{\"ok\": true}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"
  })");
  loom::data::ChatTemplateOptions opt;
  opt.now = std::tm{};
  opt.max_output_bytes = 1 << 20;
  opt.max_steps = 100000;
  try {
    const loom::data::ChatTemplate tpl(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    const std::string out = tpl.render(vars, opt);
    if (out.size() > opt.max_output_bytes) __builtin_trap();
  } catch (const loom::Error& e) {
    if (std::string(e.what()).rfind("[chat-template] fuzz", 0) != 0) __builtin_trap();  // errors name the template
  }
  return 0;
}
