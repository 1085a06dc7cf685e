// Validation of OpenAI request bodies: every refusal is a 400 naming the field.
#include <gtest/gtest.h>

#include "loom/serve/chat_template.h"
#include "loom/serve/openai_request.h"

using namespace loom::serve;
namespace net = loom::net;

namespace {

std::optional<ApiError> check(const std::string& body, ApiKind kind = ApiKind::completion, int64_t ctx = 64) {
  CompletionParams p;
  if (auto e = parse_completion_request(body, kind, &p)) return e;
  ByteTextTokenizer tok;
  GenerationRequest g;
  std::string prompt = kind == ApiKind::chat ? render_chat(p.messages) : p.prompt_text;
  return build_generation_request(p, "m", tok, ctx, prompt, &g);
}

}  // namespace

TEST(ServeOpenAiRequest, EachBadFieldIsNamed) {
  struct Case {
    const char* body;
    const char* param;
    ApiKind kind = ApiKind::completion;
  } cases[] = {
      {"{nope", ""},
      {"[1, 2]", ""},
      {R"({"prompt": "hi"})", "model"},
      {R"({"model": 3, "prompt": "hi"})", "model"},
      {R"({"model": "other", "prompt": "hi"})", "model"},
      {R"({"model": "m"})", "prompt"},
      {R"({"model": "m", "prompt": 5})", "prompt"},
      {R"({"model": "m", "prompt": ["a", "b"]})", "prompt"},
      {R"({"model": "m", "prompt": [1, -2]})", "prompt"},
      {R"({"model": "m", "prompt": [1, 300]})", "prompt"},
      {R"({"model": "m", "prompt": ""})", "prompt"},
      {R"({"model": "m", "prompt": "hi", "max_tokens": "5"})", "max_tokens"},
      {R"({"model": "m", "prompt": "hi", "max_tokens": 2.5})", "max_tokens"},
      {R"({"model": "m", "prompt": "hi", "max_tokens": -1})", "max_tokens"},
      {R"({"model": "m", "prompt": "hi", "max_tokens": 0})", "max_tokens"},
      {R"({"model": "m", "prompt": "hi", "max_tokens": 1000000000000})", "max_tokens"},
      {R"({"model": "m", "prompt": "hi", "max_tokens": 63})", "max_tokens"},
      {R"({"model": "m", "prompt": "hi", "temperature": -0.1})", "temperature"},
      {R"({"model": "m", "prompt": "hi", "temperature": 2.5})", "temperature"},
      {R"({"model": "m", "prompt": "hi", "temperature": "hot"})", "temperature"},
      {R"({"model": "m", "prompt": "hi", "top_p": 0})", "top_p"},
      {R"({"model": "m", "prompt": "hi", "top_p": 1.5})", "top_p"},
      {R"({"model": "m", "prompt": "hi", "top_k": -5})", "top_k"},
      {R"({"model": "m", "prompt": "hi", "seed": "x"})", "seed"},
      {R"({"model": "m", "prompt": "hi", "stop": 5})", "stop"},
      {R"({"model": "m", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]})", "stop"},
      {R"({"model": "m", "prompt": "hi", "stop": [""]})", "stop"},
      {R"({"model": "m", "prompt": "hi", "stream": "yes"})", "stream"},
      {R"({"model": "m", "prompt": "hi", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"model": "m", "prompt": "hi", "n": 2})", "n"},
      {R"({"model": "m", "prompt": "hi", "echo": true})", "echo"},
      {R"({"model": "m", "prompt": "hi", "logprobs": 3})", "logprobs"},
      {R"({"model": "m", "prompt": "hi", "presence_penalty": 1})", "presence_penalty"},
      {R"({"model": "m", "prompt": ")"
       "0123456789012345678901234567890123456789012345678901234567890123"
       R"("})",
       "prompt"},
      {R"({"model": "m"})", "messages", ApiKind::chat},
      {R"({"model": "m", "messages": []})", "messages", ApiKind::chat},
      {R"({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role", ApiKind::chat},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "user"}]})", "messages[1].content",
       ApiKind::chat},
      {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content",
       ApiKind::chat},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens",
       ApiKind::chat},
  };
  for (const auto& c : cases) {
    auto e = check(c.body, c.kind);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->type, "invalid_request_error");
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
    EXPECT_FALSE(e->message.empty());
  }
}

TEST(ServeOpenAiRequest, GoodRequestsFillTheEngineRequest) {
  CompletionParams p;
  ASSERT_FALSE(parse_completion_request(
      R"({"model": "m", "prompt": "abc", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
          "top_k": 7, "seed": 42, "stop": ["x"], "stream": true, "n": 1, "logprobs": null,
          "stream_options": {"include_usage": true}, "user": "ignored"})",
      ApiKind::completion, &p));
  ByteTextTokenizer tok;
  GenerationRequest g;
  ASSERT_FALSE(build_generation_request(p, "m", tok, 64, p.prompt_text, &g));
  EXPECT_EQ(g.prompt, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(g.sampling.max_tokens, 5);
  EXPECT_DOUBLE_EQ(g.sampling.temperature, 0.5);
  EXPECT_DOUBLE_EQ(g.sampling.top_p, 0.9);
  EXPECT_EQ(g.sampling.top_k, 7);
  EXPECT_EQ(g.sampling.seed, 42u);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(p.sampling.stop, std::vector<std::string>{"x"});

  // Defaults: 16 new tokens for completions (clamped to the context), the rest of it for chat.
  CompletionParams q;
  ASSERT_FALSE(parse_completion_request(R"({"model": "m", "prompt": [1, 2, 3]})", ApiKind::completion, &q));
  ASSERT_FALSE(build_generation_request(q, "m", tok, 10, "", &g));
  EXPECT_EQ(g.sampling.max_tokens, 7);
  CompletionParams c;
  ASSERT_FALSE(parse_completion_request(
      R"({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})",
      ApiKind::chat, &c));
  std::string prompt = render_chat(c.messages);
  EXPECT_EQ(prompt, "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_FALSE(build_generation_request(c, "m", tok, 100, prompt, &g));
  EXPECT_EQ(g.sampling.max_tokens, 100 - int64_t(prompt.size()));
}

TEST(ServeOpenAiRequest, ErrorObjectShape) {
  net::HttpResponse r = error_response(invalid_request("top_p", "bad"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, R"({"error":{"code":null,"message":"bad","param":"top_p","type":"invalid_request_error"}})");
  EXPECT_EQ(error_for_status(401, "x").type, "authentication_error");
  EXPECT_EQ(error_for_status(429, "x").status, 429);
}
