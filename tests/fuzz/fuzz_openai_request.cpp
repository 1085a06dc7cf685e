// libFuzzer target: an OpenAI request body (completions and chat) through the server's
// validation into engine sampling parameters. Bad input must come back as an ApiError naming
// a status and a message; accepted input must give parameters in the documented ranges.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loom/serve/chat_template.h"
#include "loom/serve/openai_request.h"
#include "loom/serve/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom::serve;
  static const ByteTextTokenizer tok;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (ApiKind kind : {ApiKind::completion, ApiKind::chat}) {
    CompletionParams p;
    if (auto e = parse_completion_request(body, kind, &p)) {
      if (e->status < 400 || e->message.empty()) __builtin_trap();
      continue;
    }
    if (p.sampling.temperature < 0 || p.sampling.temperature > 2 || !(p.sampling.top_p > 0 && p.sampling.top_p <= 1))
      __builtin_trap();
    const std::string prompt = kind == ApiKind::chat ? render_chat(p.messages) : p.prompt_text;
    GenerationRequest g;
    if (auto e = build_generation_request(p, p.model, tok, 64, prompt, &g)) {
      if (e->status < 400 || e->message.empty()) __builtin_trap();
      continue;
    }
    if (g.prompt.empty() || g.sampling.max_tokens < 1 || int64_t(g.prompt.size()) + g.sampling.max_tokens > 64)
      __builtin_trap();
    for (int32_t id : g.prompt)
      if (id < 0 || id >= 256) __builtin_trap();
  }
  return 0;
}
