// Conversations to tokens and loss masks (see conversation.h): message checks, prefix renders
// that locate the assistant replies, and the piecewise tokenization checked against the whole.
#include "loom/data/conversation.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/data/shard_format.h"

namespace loom::data {

namespace {

using ojson = nlohmann::ordered_json;

bool is_whitespace(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  });
}

// Printable form of a token's text for error messages: "\n" for a newline, and so on.
std::string quoted_text(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Where `content` (or, for templates that trim it, its text without surrounding whitespace)
// starts in `text` at or after `from`; npos when it is not there or is only whitespace.
size_t find_content(const std::string& text, size_t from, const std::string& content) {
  const size_t first = content.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return std::string::npos;
  if (const size_t at = text.find(content, from); at != std::string::npos) return at;
  const size_t last = content.find_last_not_of(" \t\r\n");
  return text.find(content.substr(first, last - first + 1), from);
}

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

std::tm local_time_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

std::optional<std::string> token_text_of(const Tokenizer& tok, std::optional<int32_t> id) {
  if (!id) return std::nullopt;
  return tok.token_text(*id);
}

}  // namespace

ojson parse_conversation(std::string_view line, const std::string& where) {
  const char* shape =
      "each line must be one JSON object {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]}";
  ojson j;
  try {
    j = ojson::parse(line);
  } catch (const nlohmann::json::exception& e) {
    fail("prepare", where, ": not JSON (", e.what(), "); ", shape);
  }
  LOOM_CHECK(j.is_object() && j.contains("messages") && j["messages"].is_array(), "prepare", where,
             ": no \"messages\" list; ", shape);
  const ojson& messages = j["messages"];
  const size_t n = messages.size();
  bool has_assistant = false;
  for (size_t i = 0; i < n; ++i) {
    const ojson& m = messages[i];
    const std::string which = str_cat("message ", i + 1, " of ", n);
    LOOM_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(), "prepare", where, ": ", which,
               " has no \"role\"; ", shape);
    const std::string role = m["role"].get<std::string>();
    LOOM_CHECK(role == "system" || role == "user" || role == "assistant", "prepare", where, ": ", which, " has role \"",
               role, "\"; roles are system, user, assistant");
    LOOM_CHECK(m.contains("content") && m["content"].is_string(), "prepare", where, ": ", which, " (", role,
               ") has no string \"content\" (lists of content parts and tool calls are not supported); give its "
               "text as a string");
    has_assistant = has_assistant || role == "assistant";
  }
  LOOM_CHECK(has_assistant, "prepare", where,
             ": the conversation has no assistant message, so none of it would be trained; give each "
             "conversation at least one assistant reply");
  return messages;
}

ConversationTokenizer::ConversationTokenizer(const Tokenizer& tok, const ChatTemplateText& tmpl)
    : tok_(tok), tmpl_(tmpl.source, tmpl.name) {
  bos_ = tmpl.bos_token.value_or(token_text_of(tok, tok.bos_id()).value_or(""));
  eos_ = tmpl.eos_token.value_or(token_text_of(tok, tok.eos_id()).value_or(""));
  render_opt_.now = local_time_now();
}

std::string ConversationTokenizer::render(const ojson& messages, size_t n, bool generation_prompt,
                                          const std::string& where) const {
  // Variables in transformers' precedence: the special tokens, then messages and the prompt flag.
  ojson vars = ojson::object();
  vars["bos_token"] = bos_;
  vars["eos_token"] = eos_;
  ojson prefix = ojson::array();
  for (size_t i = 0; i < n; ++i) prefix.push_back(messages[i]);
  vars["messages"] = std::move(prefix);
  vars["add_generation_prompt"] = generation_prompt;
  try {
    return tmpl_.render(vars, render_opt_);
  } catch (const Error& e) {
    fail("prepare", where, ": rendering messages 1 to ", n, ": ", e.what());
  }
}

std::vector<ConversationTokenizer::Span> ConversationTokenizer::find_replies(const ojson& messages,
                                                                             const std::string& whole,
                                                                             const std::string& where) const {
  const size_t n = messages.size();
  std::vector<Span> replies;
  for (size_t i = 0; i < n; ++i) {
    if (messages[i]["role"] != "assistant") continue;
    const std::string prompt = render(messages, i, true, where);
    const std::string upto = render(messages, i + 1, false, where);
    const std::string& content = messages[i]["content"].get_ref<const std::string&>();
    const std::string which = str_cat("message ", i + 1, " of ", n, " (assistant)");
    const std::string differs = str_cat(
        ": ", tmpl_.name(), " renders the conversation up to ", which,
        " differently when more messages follow, so the reply's tokens cannot be found in the whole; loom prepare "
        "--chat needs a template that renders each turn the same whatever follows it");
    LOOM_CHECK(whole.starts_with(prompt) && upto.starts_with(prompt), "prepare", where, differs);
    size_t begin = prompt.size();
    if (prompt == render(messages, i, false, where)) {
      // No generation prompt (templates such as Mistral's, where "[/INST]" ends the user's turn):
      // whatever the template writes before the content is still not the reply's.
      const size_t found = find_content(upto, begin, content);
      LOOM_CHECK(found != std::string::npos, "prepare", where, ": ", tmpl_.name(),
                 " adds nothing for add_generation_prompt and does not write the content of ", which,
                 " as given, so the reply cannot be told from the template's text around it; use a template that "
                 "writes the assistant's header as the generation prompt");
      // Spaces between the cue and the content are the reply's: a model generates " Paris" after
      // "[/INST]", and SentencePiece joins the space to the word.
      for (begin = found; begin > prompt.size() && upto[begin - 1] == ' ';) --begin;
    }
    // The reply ends where the conversation rendered up to it stops agreeing with what may follow
    // it: the whole, and the prompt for another reply. That is its end for most templates, and
    // before the end-of-text that some (Phi-3's) write only after the last message (tokenize()
    // backs such an end off to a token edge: "<|endoftext|>" and the next turn's "<|user|>"
    // agree on "<|"). The content itself must lie in the agreeing part.
    size_t end = common_prefix(upto, whole);
    if (const std::optional<std::string> next = try_render(messages, i + 1, true))
      end = std::min(end, common_prefix(upto, *next));
    LOOM_CHECK(end == upto.size() || find_content(upto.substr(0, end), begin, content) != std::string::npos, "prepare",
               where, differs);
    LOOM_CHECK(replies.empty() || begin >= replies.back().end, "prepare", where, ": ", tmpl_.name(),
               " renders the prompt for ", which, " shorter than the reply before it");
    replies.push_back({begin, end, end == upto.size()});
  }
  return replies;
}

std::optional<std::string> ConversationTokenizer::try_render(const ojson& messages, size_t n,
                                                             bool generation_prompt) const {
  try {
    return render(messages, n, generation_prompt, "");
  } catch (const Error&) {  // templates may refuse a generation prompt after a reply
    return std::nullopt;
  }
}

TokenizedConversation ConversationTokenizer::tokenize(const ojson& messages, const std::string& where) const {
  const std::string whole = render(messages, messages.size(), false, where);
  const std::vector<Span> replies = find_replies(messages, whole, where);
  TokenizedConversation out;
  out.ids = tok_.encode_special(whole);
  LOOM_CHECK(!out.ids.empty(), "prepare", where, ": ", tmpl_.name(), " renders the conversation as empty text");
  out.mask.assign(out.ids.size(), 0);
  // The number of tokens of the text before byte `at`, when that text tokenizes as the start of
  // the whole (as a prompt cut there tokenizes at inference); else the first token that differs.
  struct Cut {
    bool ok;
    size_t tokens;
    std::vector<int32_t> head;
  };
  auto cut_at = [&](size_t at) -> Cut {
    if (at == whole.size()) return {true, out.ids.size(), {}};
    Cut c{false, 0, tok_.encode_special(std::string_view(whole).substr(0, at))};
    while (c.tokens < c.head.size() && c.tokens < out.ids.size() && c.head[c.tokens] == out.ids[c.tokens]) ++c.tokens;
    c.ok = c.tokens == c.head.size();
    return c;
  };
  auto token_at = [&](size_t at) -> size_t {
    const Cut c = cut_at(at);
    if (c.ok) return c.tokens;
    const size_t k = c.tokens;
    auto text_at = [&](const std::vector<int32_t>& ids) {
      return k < ids.size() ? quoted_text(tok_.decode(std::span<const int32_t>(&ids[k], 1))) : std::string("(the end)");
    };
    fail("prepare", where,
         ": tokenized at the assistant replies' edges, the conversation differs from its tokens as "
         "a whole from token ",
         k, " on (", text_at(c.head), " there, ", text_at(out.ids),
         " whole): a reply's first or last text merges into one token with the template's text beside it; strip "
         "leading and trailing whitespace from the replies");
  };
  for (const Span& s : replies) {
    const size_t first = token_at(s.begin);
    size_t end = s.end;
    if (!s.exact_end)
      while (end > s.begin && !cut_at(end).ok) --end;
    size_t last = token_at(end);
    // The template's text after the end-of-turn token ("\n" in ChatML) is not the reply's.
    while (last > first && is_whitespace(tok_.decode(std::span<const int32_t>(&out.ids[last - 1], 1)))) --last;
    std::fill(out.mask.begin() + ptrdiff_t(first), out.mask.begin() + ptrdiff_t(last), kMaskTrained);
    out.trained += int64_t(last - first);
  }
  out.mask[0] |= kMaskConversationStart;
  return out;
}

}  // namespace loom::data
