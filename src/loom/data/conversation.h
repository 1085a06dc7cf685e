// Conversations (chat messages as the OpenAI and Hugging Face formats write them) -> token ids
// and a loss mask that trains the assistant's replies only: each reply's content and its
// end-of-turn token, not the role header the template writes before it nor the whitespace the
// template writes after it. Rendering goes through the model's own chat template; the file
// reading and shard writing around it are prepare()'s.
#pragma once
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/data/chat_template.h"
#include "loom/data/tokenizer.h"

namespace loom::data {

// A chat template and the special-token texts it reads.
struct ChatTemplateText {
  std::string source;  // the Jinja program
  std::string name;    // where it came from, for errors ("PATH:tokenizer.chat_template")
  // The template's bos_token and eos_token; unset: the tokenizer's BOS and EOS token texts.
  std::optional<std::string> bos_token, eos_token;
};

struct TokenizedConversation {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // per id: kMaskTrained, and kMaskConversationStart on the first
  int64_t trained = 0;        // ids with kMaskTrained
};

// One line of a JSONL file of conversations, checked: an object whose "messages" list holds
// {"role": "system" | "user" | "assistant", "content": "..."} objects, at least one of them the
// assistant's. Returns the list. `where` ("FILE:LINE") follows "[prepare] " in every error.
nlohmann::ordered_json parse_conversation(std::string_view line, const std::string& where);

class ConversationTokenizer {
 public:
  ConversationTokenizer(const Tokenizer& tok, const ChatTemplateText& tmpl);

  // Renders `messages` (parse_conversation's) and finds each assistant reply as the text that
  // messages[0..i] adds to the prompt for it (messages[0..i-1] with add_generation_prompt):
  // the prompt must be a prefix of the whole conversation's rendering, and the reply ends where
  // messages[0..i] rendered stops agreeing with it and with the prompt for a reply after it (its
  // content inside), as with a template that renders a turn the same whatever follows. Where add_generation_prompt adds
  // nothing, the reply starts where its content (or the content trimmed) does, with the spaces before it. The whole
  // text is tokenized once, special-token texts as their ids and no BOS added (as
  // apply_chat_template does); the text before each cut must tokenize as the start of it (as a
  // prompt cut there does at inference). A reply's trained tokens end at its last token that is
  // not whitespace (its end-of-turn token).
  TokenizedConversation tokenize(const nlohmann::ordered_json& messages, const std::string& where) const;

 private:
  struct Span {
    size_t begin, end;  // bytes of the rendered conversation
    bool exact_end;     // messages[0..i] rendered ends at `end` (else `end` is where it parts from the rest)
  };
  std::vector<Span> find_replies(const nlohmann::ordered_json& messages, const std::string& whole,
                                 const std::string& where) const;
  std::string render(const nlohmann::ordered_json& messages, size_t n, bool generation_prompt,
                     const std::string& where) const;
  std::optional<std::string> try_render(const nlohmann::ordered_json& messages, size_t n, bool generation_prompt) const;

  const Tokenizer& tok_;
  ChatTemplate tmpl_;
  std::string bos_, eos_;
  ChatTemplateOptions render_opt_;  // the time strftime_now() sees, fixed once for the whole run
};

}  // namespace loom::data
