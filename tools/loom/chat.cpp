// `loom chat --model PATH`: an interactive terminal chat with a model (a GGUF file, a Hugging Face
// directory or a loom checkpoint), as `ollama run` and `llama-cli` give: each line typed is a user
// message, the reply streams as it is generated, the conversation is kept and re-rendered through
// the model's chat template every turn (the KV cache is rebuilt from the whole history), and
// commands start with '/': /reset, /system TEXT, /help, /exit. Standard input may be a pipe, so
// the chat is scriptable (and tested) without a terminal.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "loom/core/threads.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/engine.h"
#include "loom/serve/chat_template.h"
#include "loom/serve/text_stream.h"
#include "loom/serve/tokenizer.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace {

constexpr const char* kHelp =
    "  /reset         forget the conversation (the system message stays)\n"
    "  /system TEXT   set the system message and start over\n"
    "  /help          this list\n"
    "  /exit          leave (also Ctrl-D)\n";

}  // namespace

int cmd_chat(const std::vector<std::string>& argv) {
  auto app = new_app("chat",
                     "Interactive chat with a model in the terminal: type a message, the reply streams back; the "
                     "conversation goes through the model's own chat template (ChatML for models without one). "
                     "Commands: /reset, /system TEXT, /help, /exit.");
  std::string model_path, system_prompt;
  int64_t max_tokens = 512, top_k = 0, seed = 0, threads = 0;
  double temperature = 0.7, top_p = 0.9;
  QuantOptions quant_options;
  app->add_option("--model,--checkpoint", model_path, "a GGUF file, a Hugging Face directory or a loom checkpoint")
      ->type_name("PATH")
      ->required();
  app->add_option("--system", system_prompt, "the system message")->type_name("TEXT");
  app->add_option("--max-tokens", max_tokens, "most tokens in one reply")->check(positive());
  app->add_option("--temperature", temperature, "0 to 2; 0: greedy")->check(in_range(0.0, 2.0));
  app->add_option("--top-k", top_k, "sample from the K likeliest tokens (0: off)")->check(non_negative());
  app->add_option("--top-p", top_p, "nucleus sampling, 0 < P <= 1")->check(in_range(1e-9, 1.0));
  app->add_option("--seed", seed, "sampling seed: the same seed and conversation give the same replies");
  auto* threads_opt = app->add_option("--threads", threads, "compute threads (default: OMP_NUM_THREADS or all cores)")
                          ->check(positive())
                          ->default_str("");
  add_quant_options(*app, quant_options);
  std::string lora;
  add_lora_option(*app, lora);
  if (auto rc = parse(*app, argv)) return *rc;
  if (threads_opt->count()) set_num_threads(int(threads));

  const InferenceModel im =
      load_inference_model(model_path, quant_spec_from(quant_options), stderr, false, nullptr, lora);
  const model::ModelConfig& mc = im.model->config();
  const std::unique_ptr<serve::DataTokenizer> text_tok = serve::make_text_tokenizer(im.tokenizer);
  const data::Tokenizer& tok = text_tok->tokenizer();
  const auto format =
      serve::ChatFormat::for_model(im.chat_template, im.chat_template_source, im.bos_token, im.eos_token);
  infer::SamplingParams base;
  base.temperature = temperature;
  base.top_p = top_p;
  base.top_k = infer::user_top_k(top_k);
  base.stop_token_ids = end_token_ids(im.end_ids, im.end_tokens, tok);
  base.stop = format->stop_strings();

  // One sequence at a time over the model's whole context (or what 512 MiB of KV cache holds).
  infer::EngineConfig ec;
  ec.max_num_seqs = 1;
  ec.max_seq_len = mc.n_ctx;
  const int64_t block_bytes = infer::KVCache::bytes_per_block(mc, ec.block_size, DType::f32);
  ec.num_blocks = std::min(infer::KVCache::blocks_for_tokens(mc.n_ctx, ec.block_size),
                           std::max<int64_t>(1, (int64_t(512) << 20) / block_bytes));
  ec.max_seq_len = std::min(mc.n_ctx, ec.num_blocks * ec.block_size);
  ec.detokenizer = [&](const std::vector<int32_t>& v) { return tok.decode_skip_special(v); };
  ec.quant = im.quant_ptr();
  infer::Engine engine(*im.model, ec);

  const bool interactive = isatty(STDIN_FILENO);
  std::fprintf(stderr, "[chat] %s (%s), chat format %s, context %lld tokens; /help lists the commands\n",
               im.name.c_str(), im.precision().c_str(), format->describe().c_str(), (long long)ec.max_seq_len);
  std::vector<serve::ChatMessage> history;
  if (!system_prompt.empty()) history.push_back({"system", system_prompt});
  std::string line;
  for (int64_t turn = 0;; ++turn) {
    if (interactive) std::fputs(">>> ", stdout), std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit" || line == "/bye") break;
    if (line == "/help") {
      std::fputs(kHelp, stdout);
      continue;
    }
    if (line == "/reset" || line.rfind("/system", 0) == 0) {
      if (line.rfind("/system", 0) == 0) system_prompt = line.size() > 8 ? line.substr(8) : "";
      history.clear();
      if (!system_prompt.empty()) history.push_back({"system", system_prompt});
      std::printf("[the conversation starts over%s]\n", system_prompt.empty() ? "" : " with the system message");
      continue;
    }
    if (line[0] == '/') {
      std::printf("[unknown command %s; /help lists them]\n", line.c_str());
      continue;
    }
    history.push_back({"user", line});
    std::vector<int32_t> ids;
    try {
      const std::string prompt = format->render(history);
      ids = format->special_tokens() ? tok.encode_special(prompt) : tok.encode(prompt);
    } catch (const Error& e) {
      history.pop_back();
      std::printf("[the chat template refused this conversation: %s]\n", e.what());
      continue;
    }
    if (int64_t(ids.size()) >= ec.max_seq_len) {
      history.pop_back();
      std::printf("[the conversation is %zu tokens, past the context of %lld: /reset to start over]\n", ids.size(),
                  (long long)ec.max_seq_len);
      continue;
    }
    infer::SamplingParams sp = base;
    sp.max_tokens = std::min<int64_t>(max_tokens, ec.max_seq_len - int64_t(ids.size()));
    sp.seed = uint64_t(seed) + uint64_t(turn);
    // The reply as a message of its own, cut before a stop string (serve/text_stream.h).
    serve::TextStream reply(*text_tok, sp.stop);
    auto print = [](const std::string& s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    };
    const infer::RequestOutput r = engine.run(ids, sp, [&](const infer::TokenEvent& e) {
      if (e.token < 0 || reply.stopped()) return;
      print(reply.push_token(e.token));
      if (reply.stopped()) engine.abort(e.request_id);
    });
    print(reply.finish());
    std::printf("\n");
    if (r.finish_reason == infer::FinishReason::error) {
      history.pop_back();
      std::printf("[generation failed: %s]\n", r.error.c_str());
      continue;
    }
    history.push_back({"assistant", reply.text()});
    if (r.finish_reason == infer::FinishReason::length && !reply.stopped())
      std::printf("[the reply stopped at --max-tokens %lld]\n", (long long)max_tokens);
    std::fflush(stdout);
  }
  engine.close();
  return 0;
}

}  // namespace loom::cli
