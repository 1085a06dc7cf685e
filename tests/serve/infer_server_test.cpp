// The server over the real inference engine (random gpt2-tiny weights, byte tokenizer):
// a client that disconnects mid-stream gets its request aborted and its KV blocks back in
// the pool; against the `loom serve` binary, under 64 concurrent streaming clients (256
// requests) every output equals an offline run of the engine with the same seed, nothing
// answers 5xx, and the server's memory returns to within 10% of its post-warm-up level;
// SIGTERM/SIGINT end it cleanly.
#include <map>

#include "loom/core/threads.h"
#include "loom/infer/engine.h"
#include "loom/model/decoder.h"
#include "loom/serve/infer_engine.h"
#include "sanitized.h"
#include "serve/load.h"
#include "serve/server_process.h"

namespace loom::serve::testing {
namespace {

model::ModelConfig tiny() {
  model::ModelConfig c = model::preset("gpt2-tiny");
  c.vocab_size = 256;
  return c;
}

infer::EngineConfig engine_config() {
  infer::EngineConfig c;
  c.block_size = 16;
  c.num_blocks = 160;
  c.max_num_seqs = 16;
  c.max_batched_tokens = 512;
  return c;
}

// Forwards to the real engine, but holds the engine's stepping thread inside the callback of
// each request's second token until open(), so a test can act while generation is certainly
// not finished (the engine has published its metrics after the first step).
class GatedEngine final : public Engine {
 public:
  explicit GatedEngine(Engine& inner) : inner_(inner) {}
  const TextTokenizer& tokenizer() const override { return inner_.tokenizer(); }
  int64_t context_length() const override { return inner_.context_length(); }
  int64_t max_running() const override { return inner_.max_running(); }
  uint64_t submit(GenerationRequest req, TokenEventSink sink) override {
    auto seen = std::make_shared<int>(0);
    return inner_.submit(std::move(req), [this, sink, seen](const TokenEvent& ev) {
      sink(ev);
      if (++*seen < 2) return;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return open_; });
    });
  }
  void abort(uint64_t id) override {
    aborts_++;
    inner_.abort(id);
  }
  EngineStats stats() const override { return inner_.stats(); }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::atomic<int> aborts_{0};

 private:
  Engine& inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

class ServeInferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = std::make_unique<model::Decoder>(tiny());
    model_->init_weights(3);
    engine_ = std::make_unique<infer::Engine>(*model_, engine_config());
    adapter_ = std::make_unique<InferEngineAdapter>(*engine_, tok_);
    gated_ = std::make_unique<GatedEngine>(*adapter_);
    ServeOptions opt;
    opt.http.port = 0;
    opt.served_model_name = "tiny";
    server_ = std::make_unique<ApiServer>(opt);
    server_->start();
    server_->set_engine(gated_.get());
  }
  void TearDown() override {
    gated_->open();
    server_->stop(1.0);
    server_.reset();
    adapter_.reset();
  }
  int64_t blocks_used() const { return engine_->metrics().kv_blocks_used; }

  ByteTextTokenizer tok_;
  std::unique_ptr<model::Decoder> model_;
  std::unique_ptr<infer::Engine> engine_;
  std::unique_ptr<InferEngineAdapter> adapter_;
  std::unique_ptr<GatedEngine> gated_;
  std::unique_ptr<ApiServer> server_;
};

TEST_F(ServeInferTest, DisconnectMidStreamFreesTheKvBlocks) {
  const int64_t total = engine_->metrics().kv_blocks_total;
  ASSERT_EQ(blocks_used(), 0);
  HttpClient c("127.0.0.1", server_->port(), 10);
  json body = {{"model", "tiny"}, {"prompt", std::string(20, 'k')}, {"max_tokens", 40}, {"stream", true}};
  ASSERT_EQ(c.start_stream("POST", "/v1/completions", body.dump()).status, 200);
  ASSERT_TRUE(c.next_event());  // the first token; the engine thread will be held at the second
  c.close();
  ASSERT_TRUE(eventually([&] { return gated_->aborts_ == 1; }));  // the server noticed and aborted
  EXPECT_GT(blocks_used(), 0);
  gated_->open();
  EXPECT_TRUE(eventually([&] { return blocks_used() == 0 && !engine_->has_unfinished(); }))
      << blocks_used() << " of " << total;
  EXPECT_TRUE(eventually([&] { return server_->in_flight() == 0; }));
  EXPECT_EQ(engine_->metrics().kv_blocks_total, total);
  EXPECT_LT(engine_->metrics().generated_tokens, 40);
  std::string m = HttpClient("127.0.0.1", server_->port()).request("GET", "/metrics").body;
  EXPECT_NE(m.find("loom_request_finished_total{finish_reason=\"client_gone\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("loom_kv_cache_blocks_used 0\n"), std::string::npos);
}

// The real binary, so that the memory measured is the server's alone.
const std::vector<std::string> kServeArgs = {
    "--model",        "gpt2-tiny", "--seed",        "3", "--served-model-name", "tiny",
    "--max-num-seqs", "16",        "--kv-cache-mb", "4", "--threads",           "1"};

TEST(ServeProcess, SixtyFourStreamingClientsMatchTheOfflineEngine) {
  ServerProcess proc(kServeArgs);
  ASSERT_TRUE(proc.wait_ready()) << proc.output();

  // The offline reference: the same weights in this process, one request at a time, all
  // computed up front on this thread (one compute thread, so the server keeps the CPU).
  set_num_threads(1);
  model::Decoder model(tiny());
  model.init_weights(3);
  infer::EngineConfig ec;
  ec.kv_cache_bytes = 4 << 20;
  infer::Engine offline(model, ec);
  ByteTextTokenizer tok;
  std::map<std::pair<std::string, uint64_t>, std::string> reference;
  auto add_reference = [&](int clients, int per_client, int seed_base) {
    for (int c = 0; c < clients; ++c)
      for (int k = 0; k < per_client; ++k) {
        GenerationRequest g;
        std::string prompt = "client " + std::to_string(c) + " request " + std::to_string(k);
        g.prompt = tok.encode(prompt);
        g.sampling.max_tokens = 24;
        g.sampling.seed = uint64_t(seed_base + c * per_client + k);
        std::vector<int32_t> out = offline.generate(g.prompt, to_infer_params(g, {}));
        reference[{prompt, *g.sampling.seed}] = render_completion(tok, out, {}) + "#" + std::to_string(out.size());
      }
  };
  add_reference(64, 1, 5000);
  add_reference(64, 4, 0);
  ExpectedText expected = [&](const std::string& prompt, int, uint64_t seed) { return reference.at({prompt, seed}); };
  LoadResult warm = run_load(proc.port(), "tiny", 64, 1, 24, 5000, expected);
  ASSERT_EQ(warm.ok, 64) << warm.mismatches << " mismatches, " << warm.server_errors << " 5xx, " << warm.other
                         << " other\n"
                         << proc.output();
  const int64_t rss_warm = proc.resident_bytes();

  LoadResult r = run_load(proc.port(), "tiny", 64, 4, 24, 0, expected);
  EXPECT_EQ(r.server_errors, 0);
  EXPECT_EQ(r.mismatches, 0);
  EXPECT_EQ(r.other, 0);
  EXPECT_EQ(r.ok, 256);
  // A request is counted (and its blocks freed) just after its last bytes go out, so the
  // client can ask before the last one is: the counts are awaited.
  std::string m;
  eventually([&] {
    m = HttpClient("127.0.0.1", proc.port()).request("GET", "/metrics").body;
    return m.find("loom_kv_cache_blocks_used 0\n") != std::string::npos &&
           m.find("loom_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 320\n") != std::string::npos;
  });
  EXPECT_NE(m.find("loom_kv_cache_blocks_used 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("loom_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 320\n"), std::string::npos) << m;
  EXPECT_EQ(m.find("completions\",status=\"5"), std::string::npos);  // (/health said 503 while loading)
  const int64_t rss_after = proc.resident_bytes();
  std::printf("server RSS after warm-up %.2f MiB, after 256 more requests %.2f MiB (%+.1f%%)\n",
              double(rss_warm) / 1048576.0, double(rss_after) / 1048576.0,
              100.0 * double(rss_after - rss_warm) / double(rss_warm));
  if (!kSanitizedBuild) {
    EXPECT_LE(double(rss_after), 1.10 * double(rss_warm));
  }
  EXPECT_EQ(proc.stop(SIGTERM), 0) << proc.output();
}

TEST(ServeProcess, SigtermWithAStreamInFlightExitsCleanly) {
  std::vector<std::string> args = kServeArgs;
  args.insert(args.end(), {"--shutdown-grace", "0.2"});
  ServerProcess proc(args);
  ASSERT_TRUE(proc.wait_ready()) << proc.output();
  HttpClient c("127.0.0.1", proc.port(), 10);
  // A long request: 60 tokens of a 64-token context, slowed by many others.
  json body = {{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 60}, {"stream", true}};
  ASSERT_EQ(c.start_stream("POST", "/v1/completions", body.dump()).status, 200);
  ASSERT_TRUE(c.next_event());
  ::kill(proc.pid(), SIGTERM);
  // The stream ends properly: finished normally ([DONE]) or with the shutdown error event.
  std::string last;
  EXPECT_NO_THROW({
    while (auto ev = c.next_event()) last = *ev;
  });
  EXPECT_TRUE(last == "[DONE]" || last.find("shutting down") != std::string::npos) << last;
  EXPECT_EQ(proc.stop(SIGTERM), 0) << proc.output();
  EXPECT_NE(proc.output().find("[serve] SIGTERM: stopping"), std::string::npos) << proc.output();
}

TEST(ServeProcess, SigintWhileIdleAndBadFlags) {
  ServerProcess proc(kServeArgs);
  ASSERT_TRUE(proc.wait_ready()) << proc.output();
  EXPECT_EQ(proc.stop(SIGINT), 0) << proc.output();
  EXPECT_NE(proc.output().find("[serve] stopped"), std::string::npos);

  ServerProcess ckpt({"--checkpoint", "/nonexistent"});
  EXPECT_EQ(ckpt.stop(0, 20), 1);  // signal 0: just wait for the exit
  EXPECT_NE(ckpt.output().find("--checkpoint"), std::string::npos) << ckpt.output();
  ServerProcess both({"--checkpoint", "x", "--model", "gpt2-tiny"});
  EXPECT_EQ(both.stop(0, 20), 2);
}

// The KV cache must hold one request of the model's full context: a --kv-cache-mb below that is
// refused before anything loads, with the size needed; the ready line says how many fit.
TEST(ServeProcess, KvCacheTooSmallForOneFullContextRequestIsRefused) {
  // gpt2-tiny keeps 2 layers x 2 x 32 floats a token: 4096 tokens need 2 MiB.
  ServerProcess small({"--model", "gpt2-tiny", "--n-ctx", "4096", "--kv-cache-mb", "1"});
  EXPECT_EQ(small.stop(0, 20), 2);
  EXPECT_NE(small.output().find("[serve] --kv-cache-mb 1 is too small for one request of the model's full context: "
                                "4096 tokens (model.n_ctx) need 2.00 MiB of KV cache; give --kv-cache-mb 2 or more"),
            std::string::npos)
      << small.output();
  ServerProcess enough({"--model", "gpt2-tiny", "--n-ctx", "4096", "--kv-cache-mb", "4", "--threads", "1"});
  ASSERT_TRUE(enough.wait_ready()) << enough.output();
  const std::string line = "KV cache 4.00 MiB (512 blocks of 16 tokens: 2.0 full-context requests)";
  // /health turns 200 just before the ready line is printed.
  EXPECT_TRUE(eventually([&] { return enough.output().find(line) != std::string::npos; })) << enough.output();
  EXPECT_EQ(enough.stop(SIGTERM), 0) << enough.output();
}

}  // namespace
}  // namespace loom::serve::testing
