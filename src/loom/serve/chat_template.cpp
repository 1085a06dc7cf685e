// ChatML rendering for chat requests.
#include "loom/serve/chat_template.h"

namespace loom::serve {

std::string render_chat(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + kChatTurnEnd + "\n";
  return out + "<|im_start|>assistant\n";
}

}  // namespace loom::serve
