// The chat template: how /v1/chat/completions turns messages into one prompt. loom uses
// ChatML (documented in docs/SERVING.md), and stops generation at its end-of-turn marker.
#pragma once
#include <string>
#include <vector>

#include "loom/serve/openai_request.h"

namespace loom::serve {

inline constexpr const char* kChatTurnEnd = "<|im_end|>";

// "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n".
std::string render_chat(const std::vector<ChatMessage>& messages);

}  // namespace loom::serve
