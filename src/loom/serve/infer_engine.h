// Puts loom::infer::Engine behind the server's Engine interface: owns the thread that steps
// the engine while it has work (and sleeps when it has none), relays its events, and fails requests cleanly instead of
// crashing if a step ever throws.
#pragma once
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "loom/infer/engine.h"
#include "loom/serve/engine_api.h"

namespace loom::serve {

class InferEngineAdapter final : public Engine {
 public:
  // `engine` and `tok` must outlive the adapter; the tokenizer's vocabulary must match the
  // model's.
  InferEngineAdapter(infer::Engine& engine, const TextTokenizer& tok);
  ~InferEngineAdapter() override;  // stops the stepping thread

  const TextTokenizer& tokenizer() const override { return tok_; }
  int64_t context_length() const override;
  int64_t max_running() const override;
  uint64_t submit(GenerationRequest req, TokenEventSink sink) override;
  void abort(uint64_t id) override;
  EngineStats stats() const override;

  // The last step failure ("" if none); after one, submit() throws.
  std::string failure() const;

 private:
  void loop();
  void fail_all(const std::string& why);

  infer::Engine& engine_;
  const TextTokenizer& tok_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, TokenEventSink> live_;  // requests without their final event yet
  std::string failure_;
  bool quit_ = false;
  std::thread thread_;
};

// What the engine is given for a server request: its sampling without the stop strings (the
// server applies those to the text), stopping at the tokenizer's end tokens.
infer::SamplingParams to_infer_params(const GenerationRequest& req, const std::vector<int32_t>& end_tokens);

}  // namespace loom::serve
