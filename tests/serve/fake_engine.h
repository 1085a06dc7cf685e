// A deterministic stand-in for the inference engine, for server tests: a thread that emits
// one token per tick for up to max_running requests. temperature 0 echoes the prompt's
// bytes cyclically (scripted text for stop-string tests); otherwise letters drawn from
// (seed, prompt, position). Counts aborts and "KV blocks" so tests can check they are freed.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "loom/serve/engine_api.h"

namespace loom::serve::testing {

struct FakeEngineOptions {
  int64_t context_length = 256;
  int64_t max_running = 4;
  double tick_s = 0.001;
  int64_t block_size = 16;
  int64_t total_blocks = 4096;
  // Requests asking for token probabilities (a cascade edge) get this one for every token.
  std::function<double(const GenerationRequest&)> token_prob;
  std::string version;  // model_version()
};

class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(FakeEngineOptions opt = {}) : opt_(opt), thread_([this] { loop(); }) {}
  ~FakeEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  const TextTokenizer& tokenizer() const override { return tok_; }
  int64_t context_length() const override { return opt_.context_length; }
  std::string model_version() const override { return opt_.version; }
  int64_t max_running() const override { return opt_.max_running; }

  uint64_t submit(GenerationRequest req, TokenEventSink sink) override {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t id = next_id_++;
    reqs_[id] = Req{std::move(req), std::move(sink), 0, false};
    waiting_.push_back(id);
    ++submitted_;
    cv_.notify_all();
    return id;
  }
  void abort(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reqs_.find(id);
    if (it == reqs_.end() || it->second.abort) return;
    it->second.abort = true;
    ++aborts_;
    cv_.notify_all();
  }
  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s;
    s.running = int64_t(running_.size());
    s.waiting = int64_t(waiting_.size());
    s.kv_blocks_total = opt_.total_blocks;
    for (uint64_t id : running_) {
      const Req& r = reqs_.at(id);
      s.kv_blocks_used += (int64_t(r.req.prompt.size()) + r.generated + opt_.block_size - 1) / opt_.block_size;
    }
    return s;
  }

  // While paused no tokens are produced (requests pile up for queue tests).
  void set_paused(bool p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      paused_ = p;
    }
    cv_.notify_all();
  }
  int64_t aborts() const { return aborts_.load(); }
  int64_t submitted() const { return submitted_.load(); }

  // The tokens this engine produces for `req` when nothing interrupts it (the "offline" run).
  static std::vector<int32_t> reference(const GenerationRequest& req) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < req.sampling.max_tokens; ++i) out.push_back(token_at(req, i));
    return out;
  }

 private:
  struct Req {
    GenerationRequest req;
    TokenEventSink sink;
    int64_t generated;
    bool abort;
  };

  static int32_t token_at(const GenerationRequest& r, int64_t i) {
    if (r.sampling.temperature == 0) return r.prompt[size_t(i) % r.prompt.size()];
    uint64_t h = r.sampling.seed.value_or(0) * 0x9E3779B97F4A7C15ull + uint64_t(i);
    for (int32_t t : r.prompt) h = (h ^ uint64_t(t)) * 0x100000001B3ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return int32_t('a' + h % 26);
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!quit_) {
      // Aborts are honoured even while paused: they free blocks at once.
      for (auto it = reqs_.begin(); it != reqs_.end();) {
        if (it->second.abort) {
          it->second.sink({-1, FinishReason::abort, {}});
          std::erase(running_, it->first);
          std::erase(waiting_, it->first);
          it = reqs_.erase(it);
        } else {
          ++it;
        }
      }
      while (int64_t(running_.size()) < opt_.max_running && !waiting_.empty()) {
        running_.push_back(waiting_.front());
        waiting_.pop_front();
      }
      if (paused_ || running_.empty()) {
        cv_.wait_for(lock, std::chrono::milliseconds(5));
        continue;
      }
      for (auto it = running_.begin(); it != running_.end();) {
        Req& r = reqs_.at(*it);
        int32_t tok = token_at(r.req, r.generated);
        ++r.generated;
        bool done = r.generated >= r.req.sampling.max_tokens;
        const double prob = r.req.sampling.token_probs && opt_.token_prob ? opt_.token_prob(r.req)
                                                                          : std::numeric_limits<double>::quiet_NaN();
        r.sink({tok, done ? FinishReason::length : FinishReason::none, {}, prob});
        if (done) {
          reqs_.erase(*it);
          it = running_.erase(it);
        } else {
          ++it;
        }
      }
      cv_.wait_for(lock, std::chrono::duration<double>(opt_.tick_s));
    }
  }

  FakeEngineOptions opt_;
  ByteTextTokenizer tok_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Req> reqs_;
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_;
  uint64_t next_id_ = 1;
  bool paused_ = false, quit_ = false;
  std::atomic<int64_t> aborts_{0}, submitted_{0};
  std::thread thread_;
};

}  // namespace loom::serve::testing
