// The stepping thread and the event mapping between loom::infer and the server.
#include "loom/serve/infer_engine.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "loom/core/error.h"

namespace loom::serve {

infer::SamplingParams to_infer_params(const GenerationRequest& req, const std::vector<int32_t>& end_tokens) {
  infer::SamplingParams p = req.sampling;
  p.stop.clear();
  p.stop_token_ids = end_tokens;
  return p;
}

InferEngineAdapter::InferEngineAdapter(infer::Engine& engine, const TextTokenizer& tok) : engine_(engine), tok_(tok) {
  LOOM_CHECK(tok.vocab_size() <= engine.model_config().vocab_size, "serve", "the tokenizer's vocabulary (",
             tok.vocab_size(), ") is larger than the model's (model.vocab_size=", engine.model_config().vocab_size,
             "); use a matching tokenizer or model");
  thread_ = std::thread([this] { loop(); });
}

InferEngineAdapter::~InferEngineAdapter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t InferEngineAdapter::context_length() const { return engine_.max_seq_len(); }
int64_t InferEngineAdapter::max_running() const { return engine_.config().max_num_seqs; }

uint64_t InferEngineAdapter::submit(GenerationRequest req, TokenEventSink sink) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) fail("serve", "the engine stopped after an error: ", failure_);
  // Under mu_, so the id is in live_ before the stepping thread can deliver its first event.
  int64_t id = engine_.add_request(std::move(req.prompt), to_infer_params(req, tok_.end_tokens()),
                                   [this](const infer::TokenEvent& ev) {
                                     TokenEventSink sink;
                                     {
                                       std::lock_guard<std::mutex> l(mu_);
                                       auto it = live_.find(ev.request_id);
                                       if (it == live_.end()) return;
                                       sink = it->second;
                                       if (ev.finish != infer::FinishReason::none) live_.erase(it);
                                     }
                                     sink({ev.token, ev.finish, ev.error, ev.prob});
                                   });
  live_[id] = std::move(sink);
  cv_.notify_all();
  return uint64_t(id);
}

void InferEngineAdapter::abort(uint64_t id) { engine_.abort(int64_t(id)); }

EngineStats InferEngineAdapter::stats() const {
  infer::EngineMetrics m = engine_.metrics();
  EngineStats s;
  s.running = m.num_running;
  s.waiting = m.num_waiting;
  s.kv_blocks_used = m.kv_blocks_used;
  s.kv_blocks_total = m.kv_blocks_total;
  s.spec_proposed = m.spec_proposed;
  s.spec_accepted = m.spec_accepted;
  return s;
}

std::string InferEngineAdapter::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void InferEngineAdapter::fail_all(const std::string& why) {
  // The exception's text is for the operator's log; clients (and later submissions, refused
  // from now on) get an id that finds the log line.
  static std::atomic<uint64_t> failures{0};
  const std::string id = str_cat("engine-", ::getpid(), "-", ++failures);
  const std::string told = str_cat("the inference engine failed (error id ", id, "; the server log has the cause)");
  std::map<int64_t, TokenEventSink> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = told;
    live.swap(live_);
  }
  std::fprintf(stderr, "[serve] engine step failed (error id %s): %s; failing %zu request(s)\n", id.c_str(),
               why.c_str(), live.size());
  for (auto& [rid, sink] : live) sink({-1, FinishReason::error, told});
}

void InferEngineAdapter::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // The timeout covers aborts, which do not notify us.
      cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return quit_ || (failure_.empty() && !live_.empty()); });
      if (quit_) return;
      if (!failure_.empty() || !engine_.has_unfinished()) continue;
    }
    try {
      engine_.step();
    } catch (const std::exception& e) {
      fail_all(e.what());
    }
  }
}

}  // namespace loom::serve
