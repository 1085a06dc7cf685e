// `loom prepare --chat` as a library: conversations rendered through a chat template become
// shards whose mask trains exactly the assistant replies and their end-of-turn token (checked by
// decoding the trained tokens), with SmolLM2's own tokenizer and template where its GGUF is
// present, a small tokenizer.json from the goldens and the byte tokenizer everywhere; the split
// keeps conversations whole; every refusal names the file and line and writes nothing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "data/data_testing.h"
#include "loom/data/dataset.h"
#include "loom/data/prepare.h"
#include "loom/io/gguf.h"

namespace loom::data {
namespace {

using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

const std::filesystem::path kTemplates =
    std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/chat_templates/templates";

std::string smollm2_gguf() {
  if (const char* env = std::getenv("LOOM_TEST_MODEL"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

ChatTemplateText template_file(const std::string& name) {
  const auto path = kTemplates / name;
  return {read_bytes(path), path.string(), std::nullopt, std::nullopt};
}

// Three conversations: a system prompt, two assistant turns in one, replies with punctuation and
// a newline inside.
const char* kConversations =
    R"({"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "Four."}]})"
    "\n"
    R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue.\nOr green."}]})"
    "\n\n"
    R"({"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]})"
    "\n";
const std::vector<std::string> kReplies = {"Four.", "Hello! How can I help?", "Blue.\nOr green.", "Paris."};

PrepareOptions chat_options(const ScratchDir& dir, const std::string& tokenizer, ChatTemplateText tmpl,
                            const std::string& jsonl = kConversations) {
  write_bytes(dir / "chat.jsonl", jsonl);
  PrepareOptions opt;
  opt.chat_inputs = {(dir / "chat.jsonl").string()};
  opt.tokenizer = tokenizer;
  opt.chat_template = std::move(tmpl);
  opt.out_dir = (dir / "out").string();
  opt.data_dir = testing::repo_data_dir();
  opt.val_fraction = 0;
  return opt;
}

// The runs of trained tokens of a shard, each decoded.
std::vector<std::string> trained_runs(const TokenDataset& d, const Tokenizer& tok) {
  std::vector<int32_t> ids(size_t(d.size()));
  std::vector<uint8_t> mask(size_t(d.size()));
  d.read(0, d.size(), ids.data());
  d.read_mask(0, d.size(), mask.data());
  std::vector<std::string> runs;
  std::vector<int32_t> run;
  for (size_t i = 0; i <= ids.size(); ++i) {
    if (i < ids.size() && (mask[i] & kMaskTrained)) {
      run.push_back(ids[i]);
    } else if (!run.empty()) {
      runs.push_back(tok.decode(run));
      run.clear();
    }
  }
  return runs;
}

std::vector<std::string> with_end(const std::string& end) {
  std::vector<std::string> out;
  for (const auto& r : kReplies) out.push_back(r + end);
  return out;
}

// What the untrained tokens hold: everything the template writes that is not a reply.
std::string untrained_text(const TokenDataset& d, const Tokenizer& tok) {
  std::vector<int32_t> ids(size_t(d.size())), kept;
  std::vector<uint8_t> mask(size_t(d.size()));
  d.read(0, d.size(), ids.data());
  d.read_mask(0, d.size(), mask.data());
  for (size_t i = 0; i < ids.size(); ++i)
    if (!(mask[i] & kMaskTrained)) kept.push_back(ids[i]);
  return tok.decode(kept);
}

TEST(ChatPrepare, ByteTokenizerTrainsTheRepliesAndTheirEndOfTurn) {
  ScratchDir dir;
  const PrepareResult r = prepare(chat_options(dir, "byte", template_file("chatml.jinja")));
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.train_conversations, 3);
  const TokenDataset d((dir / "out/train.bin").string());
  ASSERT_TRUE(d.has_mask());
  EXPECT_EQ(d.conversation_starts().size(), 3u);
  const ByteTokenizer tok;
  // The "\n" ChatML writes after <|im_end|> is the template's, not the reply's.
  EXPECT_EQ(trained_runs(d, tok), with_end("<|im_end|>"));
  EXPECT_EQ(r.train_trained_tokens, int64_t(with_end("<|im_end|>")[0].size() + with_end("<|im_end|>")[1].size() +
                                            with_end("<|im_end|>")[2].size() + with_end("<|im_end|>")[3].size()));
  const std::string rest = untrained_text(d, tok);
  for (const char* user : {"You are terse.", "What is 2+2?", "Name a colour.", "<|im_start|>assistant\n"})
    EXPECT_NE(rest.find(user), std::string::npos) << user;
  EXPECT_EQ(rest.find("Paris"), std::string::npos);
}

TEST(ChatPrepare, SmolLM2TrainsTheRepliesAndImEnd) {
  const std::string gguf = smollm2_gguf();
  if (!std::filesystem::exists(gguf))
    GTEST_SKIP() << "SmolLM2 GGUF not found at " << gguf << ": run scripts/fetch-test-model.sh";
  ScratchDir dir;
  ChatTemplateText tmpl{io::GgufFile::open(gguf).get_string("tokenizer.chat_template"),
                        gguf + ":tokenizer.chat_template", std::nullopt, std::nullopt};
  prepare(chat_options(dir, gguf, tmpl));
  const TokenDataset d((dir / "out/train.bin").string());
  const auto tok = make_tokenizer(gguf);
  EXPECT_EQ(trained_runs(d, *tok), with_end("<|im_end|>"));
  // Each reply ends in the one special token <|im_end|> (id 2), not its text spelled out.
  std::vector<int32_t> ids(size_t(d.size()));
  std::vector<uint8_t> mask(size_t(d.size()));
  d.read(0, d.size(), ids.data());
  d.read_mask(0, d.size(), mask.data());
  int ends = 0;
  for (size_t i = 0; i + 1 < ids.size(); ++i)
    if ((mask[i] & kMaskTrained) && !(mask[i + 1] & kMaskTrained)) {
      EXPECT_EQ(ids[i], 2) << i;
      ++ends;
    }
  EXPECT_EQ(ends, 4);
  const std::string rest = untrained_text(d, *tok);
  // SmolLM2's template adds its default system prompt where the conversation has none.
  EXPECT_NE(rest.find("You are a helpful AI assistant named SmolLM"), std::string::npos) << rest;
  EXPECT_NE(rest.find("<|im_start|>user\nCapital of France?<|im_end|>"), std::string::npos) << rest;
}

TEST(ChatPrepare, SmallTokenizerJsonNeedsNoDownload) {
  ScratchDir dir;
  const std::string tokenizer =
      (std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/hf_tokenizers/qwen2/tokenizer.json").string();
  prepare(chat_options(dir, tokenizer, template_file("qwen2_5.jinja")));
  const TokenDataset d((dir / "out/train.bin").string());
  const auto tok = make_tokenizer(tokenizer);
  EXPECT_EQ(trained_runs(d, *tok), with_end("<|im_end|>"));
  EXPECT_EQ(tok->token_id("<|im_end|>"), 3002);
  const std::string rest = untrained_text(d, *tok);
  EXPECT_NE(rest.find("You are Qwen"), std::string::npos) << rest;  // Qwen2.5's default system prompt
}

TEST(ChatPrepare, ValidationHoldsTheLastConversationsWhole) {
  ScratchDir dir;
  std::string jsonl;
  for (int i = 0; i < 10; ++i)
    jsonl += R"({"messages": [{"role": "user", "content": "Question )" + std::to_string(i) +
             R"(?"}, {"role": "assistant", "content": "Answer )" + std::to_string(i) + R"(."}]})" + "\n";
  PrepareOptions opt = chat_options(dir, "byte", template_file("chatml.jinja"), jsonl);
  opt.val_fraction = 0.2;
  const PrepareResult r = prepare(opt);
  EXPECT_EQ(r.train_conversations, 8);
  EXPECT_EQ(r.val_conversations, 2);
  const TokenDataset train((dir / "out/train.bin").string()), val((dir / "out/val.bin").string());
  EXPECT_EQ(val.conversation_starts(), (std::vector<int64_t>{0, val.size() / 2}));
  const ByteTokenizer tok;
  EXPECT_EQ(trained_runs(val, tok), (std::vector<std::string>{"Answer 8.<|im_end|>", "Answer 9.<|im_end|>"}));
  EXPECT_EQ(train.size() + val.size(), r.train_tokens + r.val_tokens);
  const auto meta = nlohmann::json::parse(read_bytes(dir / "out/meta.json"));
  EXPECT_EQ(meta["format_version"], 2);
  EXPECT_EQ(meta["loss_mask"], true);
  EXPECT_EQ(meta["train"]["conversations"], 8);
  EXPECT_EQ(meta["val"]["conversations"], 2);
  EXPECT_EQ(meta["val"]["trained_tokens"], 2 * std::string("Answer 8.<|im_end|>").size());
  EXPECT_EQ(meta["chat_template"], (kTemplates / "chatml.jinja").string());
}

TEST(ChatPrepare, BadConversationsNameTheFileAndLine) {
  ScratchDir dir;
  const std::string ok = R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})";
  auto error_for = [&](const std::string& bad_line) {
    const PrepareOptions opt = chat_options(dir, "byte", template_file("chatml.jinja"), ok + "\n\n" + bad_line + "\n");
    return testing::error_of([&] { prepare(opt); });
  };
  const std::string at = "[prepare] " + (dir / "chat.jsonl").string() + ":3: ";
  const std::string shape =
      "each line must be one JSON object {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]}";
  std::string e = error_for("{\"messages\": [");
  EXPECT_EQ(e.rfind(at + "not JSON (", 0), 0u) << e;
  EXPECT_NE(e.find(shape), std::string::npos) << e;
  EXPECT_EQ(error_for(R"({"conversation": []})"), at + "no \"messages\" list; " + shape);
  EXPECT_EQ(error_for(R"({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]})"),
            at + "message 2 of 2 has role \"tool\"; roles are system, user, assistant");
  EXPECT_EQ(error_for(R"({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]})"),
            at + "the conversation has no assistant message, so none of it would be trained; give each "
                 "conversation at least one assistant reply");
  EXPECT_EQ(error_for(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]})"),
            at + "message 1 of 1 (user) has no string \"content\" (lists of content parts and tool calls are not "
                 "supported); give its text as a string");
  EXPECT_EQ(error_for(R"({"messages": [{"content": "x"}]})"), at + "message 1 of 1 has no \"role\"; " + shape);
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));  // nothing written by any refusal

  // A file with no conversations at all, and a template that cannot render the conversation.
  e = testing::error_of([&] { prepare(chat_options(dir, "byte", template_file("chatml.jinja"), "\n  \n")); });
  EXPECT_EQ(e, "[prepare] " + (dir / "chat.jsonl").string() + " holds no conversations; give one JSON object per line");
  ChatTemplateText raises{"{{ raise_exception('roles must alternate') }}", "strict.jinja", std::nullopt, std::nullopt};
  e = testing::error_of([&] { prepare(chat_options(dir, "byte", raises, ok + "\n")); });
  EXPECT_EQ(e, "[prepare] " + (dir / "chat.jsonl").string() +
                   ":1: rendering messages 1 to 2: [chat-template] strict.jinja: the template raised: roles must "
                   "alternate");
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(ChatPrepare, TemplatesWhoseTurnsCannotBeCutAreRefused) {
  ScratchDir dir;
  const std::string ok =
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]})";
  const std::string at = "[prepare] " + (dir / "chat.jsonl").string() + ":1: ";
  // The last message rendered apart from the others: a turn's text depends on what follows.
  ChatTemplateText last{
      "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m.content }}|{% endfor %}"
      "{% if add_generation_prompt %}A:{% endif %}",
      "last.jinja", std::nullopt, std::nullopt};
  std::string e = testing::error_of([&] { prepare(chat_options(dir, "byte", last, ok + "\n")); });
  EXPECT_EQ(e, at + "last.jinja renders the conversation up to message 2 of 3 (assistant) differently when more "
                    "messages follow, so the reply's tokens cannot be found in the whole; loom prepare --chat needs a "
                    "template that renders each turn the same whatever follows it");
  ChatTemplateText shouting{"{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}</s>{% endfor %}",
                            "shouting.jinja", std::nullopt, std::nullopt};
  e = testing::error_of([&] { prepare(chat_options(dir, "byte", shouting, ok + "\n")); });
  EXPECT_EQ(e, at + "shouting.jinja adds nothing for add_generation_prompt and does not write the content of message "
                    "2 of 3 (assistant) as given, so the reply cannot be told from the template's text around it; use "
                    "a template that writes the assistant's header as the generation prompt");
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(ChatPrepare, TemplatesWithoutAGenerationPromptTrainFromTheContent) {
  ScratchDir dir;
  // Mistral's "[INST] ...[/INST]" ends the user's turn; the reply follows with nothing before it.
  // (Its template puts a system message into the last user turn, so these have none.)
  const std::string jsonl =
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue.\nOr green."}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]})"
      "\n";
  ChatTemplateText mistral = template_file("mistral_v0_3.jinja");
  mistral.bos_token = "<s>";
  mistral.eos_token = "</s>";
  prepare(chat_options(dir, "byte", mistral, jsonl));
  const TokenDataset d((dir / "out/train.bin").string());
  const ByteTokenizer tok;
  // The space the template writes before the content is the reply's, as a model generates it.
  EXPECT_EQ(trained_runs(d, tok),
            (std::vector<std::string>{" Hello! How can I help?</s>", " Blue.\nOr green.</s>", " Paris.</s>"}));
  EXPECT_EQ(untrained_text(d, tok),
            "<s>[INST] Hi[/INST][INST] Name a colour.[/INST]<s>[INST] Capital of France?[/INST]");
}

TEST(ChatPrepare, AnEndOfTextAfterTheLastMessageIsNotTheReplys) {
  ScratchDir dir;
  // Phi-3's template ends a conversation rendered without a generation prompt with its EOS, so
  // the conversation up to a reply and the whole part after the reply's "<|end|>\n" ("<|endoftext|>"
  // there, "<|user|>" in the whole). Its markers are special tokens, added here to the small
  // Qwen2-style tokenizer.
  auto tj = nlohmann::json::parse(
      read_bytes(std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/hf_tokenizers/qwen2/tokenizer.json"));
  int id = 3004;
  for (const char* t : {"<|end|>", "<|user|>", "<|assistant|>", "<|system|>"})
    tj["added_tokens"].push_back({{"id", id++},
                                  {"content", t},
                                  {"single_word", false},
                                  {"lstrip", false},
                                  {"rstrip", false},
                                  {"normalized", false},
                                  {"special", true}});
  write_bytes(dir / "tokenizer.json", tj.dump());
  ChatTemplateText phi3 = template_file("phi3.jinja");
  phi3.eos_token = "<|endoftext|>";
  prepare(chat_options(dir, (dir / "tokenizer.json").string(), phi3));
  const TokenDataset d((dir / "out/train.bin").string());
  const auto tok = make_tokenizer((dir / "tokenizer.json").string());
  EXPECT_EQ(trained_runs(d, *tok), with_end("<|end|>"));
  EXPECT_TRUE(untrained_text(d, *tok).ends_with("<|user|>\nCapital of France?<|end|>\n<|assistant|>\n\n<|endoftext|>"));
}

TEST(ChatPrepare, AReplyThatMergesWithTheTemplateTextIsRefused) {
  ScratchDir dir;
  // The prompt ends in a space that GPT-2 joins to the reply's first word (" b"), so the reply's
  // tokens as generated after the prompt are not those of the conversation as a whole.
  ChatTemplateText colon{
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
      "{% if add_generation_prompt %}assistant: {% endif %}",
      "colon.jinja", std::nullopt, std::nullopt};
  const std::string jsonl = R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})"
                            "\n";
  const std::string e = testing::error_of([&] { prepare(chat_options(dir, "gpt2", colon, jsonl)); });
  EXPECT_EQ(e, "[prepare] " + (dir / "chat.jsonl").string() +
                   ":1: tokenized at the assistant replies' edges, the conversation differs from its tokens as a "
                   "whole from token 7 on (\" \" there, \" b\" whole): a reply's first or last text merges into one "
                   "token with the template's text beside it; strip leading and trailing whitespace from the replies");
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

}  // namespace
}  // namespace loom::data
