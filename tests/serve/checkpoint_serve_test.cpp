// `loom serve --checkpoint`: a checkpoint written by a few steps of the trainer is found (run
// directory -> newest valid step), verified, loaded, and served with the same outputs as an
// offline engine on those weights; a corrupt one is refused with the reason. A checkpoint
// whose weights hold a NaN (intact checksums, as a diverged run saves it): `loom generate`
// fails naming the NaN logits and the weight, and `loom serve` answers its requests 500 with
// the cause and goes on serving. Also the GPT-2 tokenizer behind the server's streaming
// interface.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "loom/infer/engine.h"
#include "loom/io/checksum.h"
#include "loom/io/file.h"
#include "loom/model/decoder.h"
#include "loom/serve/infer_engine.h"
#include "loom/train/checkpoint.h"
#include "loom/train/dataset_source.h"
#include "loom/train/trainer.h"
#include "serve/server_fixture.h"
#include "serve/server_process.h"
#include "train/train_testing.h"

namespace loom::serve::testing {
namespace {

namespace fs = std::filesystem;

// Trains gpt2-tiny (byte vocabulary, context 32) for a few steps; returns the checkpoint.
std::string train_checkpoint(const std::string& dir) {
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  train::TrainConfig cfg =
      train::parse_train_config(loom::testing::tiny_config_yaml(data, dir + "/ck"), {"schedule.steps=3"});
  train::DatasetSource src(cfg);
  train::TrainerOptions o;
  o.log = std::fopen("/dev/null", "w");
  train::TrainResult r = train::Trainer(cfg, src, o).run();
  std::fclose(o.log);
  return r.last_checkpoint;
}

// The greedy completion of `prompt` by an offline engine on model m, as the server renders it.
std::string greedy_text(const model::Decoder& m, const std::string& prompt, int64_t max_tokens) {
  ByteTextTokenizer tok;
  GenerationRequest g;
  g.prompt = tok.encode(prompt);
  g.sampling.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  infer::EngineConfig ec;
  ec.kv_cache_bytes = 4 << 20;
  infer::Engine offline(m, ec);
  return render_completion(tok, offline.generate(g.prompt, to_infer_params(g, {})), {});
}

TEST(ServeCheckpoint, ServesTheTrainedWeights) {
  const std::string dir = loom::testing::temp_dir("serve_checkpoint");
  const std::string step_dir = train_checkpoint(dir);
  ASSERT_FALSE(step_dir.empty());
  const model::ModelConfig mc = model::checkpoint_model_config(step_dir);
  model::Decoder model(mc);
  train::load_checkpoint_weights(step_dir, model);
  const std::string want = greedy_text(model, "Hello", 20);
  model::Decoder other(mc);  // the weights the server would have without the checkpoint
  other.init_weights(1337);
  ASSERT_NE(greedy_text(other, "Hello", 20), want);

  ServerProcess proc({"--checkpoint", dir + "/ck", "--threads", "1", "--kv-cache-mb", "4"});
  ASSERT_TRUE(proc.wait_ready()) << proc.output();
  EXPECT_NE(proc.output().find(step_dir), std::string::npos) << proc.output();
  HttpClient c("127.0.0.1", proc.port());
  json body = {{"model", "gpt2-tiny"}, {"prompt", "Hello"}, {"max_tokens", 20}, {"temperature", 0}};
  ClientResponse r = c.request("POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], want);
  EXPECT_EQ(proc.stop(SIGTERM), 0);

  // One flipped byte in the weights: refused, naming the file.
  ASSERT_TRUE(loom::testing::flip_byte(step_dir + "/model.safetensors", 200, 0x40));
  ServerProcess bad({"--checkpoint", step_dir, "--threads", "1"});
  EXPECT_EQ(bad.stop(0, 30), 1);
  EXPECT_NE(bad.output().find("model.safetensors"), std::string::npos) << bad.output();
  ServerProcess none({"--checkpoint", dir + "/ck", "--threads", "1"});
  EXPECT_EQ(none.stop(0, 30), 1);
  EXPECT_NE(none.output().find("no valid checkpoint"), std::string::npos) << none.output();
  fs::remove_all(dir);
}

// `loom serve --speculative`: greedy completions equal the offline engine's without
// speculation, for n-gram lookup and for a draft (here the checkpoint itself, which the server
// warns is not smaller than the target); /metrics counts the accepted proposals.
TEST(ServeCheckpoint, SpeculativeServingReturnsThePlainOutputs) {
  const std::string dir = loom::testing::temp_dir("serve_speculative");
  const std::string step_dir = train_checkpoint(dir);
  ASSERT_FALSE(step_dir.empty());
  const model::ModelConfig mc = model::checkpoint_model_config(step_dir);
  model::Decoder model(mc);
  train::load_checkpoint_weights(step_dir, model);
  const std::string want = greedy_text(model, "to be or to be", 16);
  for (const std::string& spec : std::vector<std::string>{"ngram,k=4", "draft=" + step_dir + ",k=3"}) {
    ServerProcess proc({"--checkpoint", dir + "/ck", "--threads", "1", "--kv-cache-mb", "4", "--speculative", spec});
    ASSERT_TRUE(proc.wait_ready()) << proc.output();
    EXPECT_NE(proc.output().find("speculative"), std::string::npos) << proc.output();
    HttpClient c("127.0.0.1", proc.port());
    json body = {{"model", "gpt2-tiny"}, {"prompt", "to be or to be"}, {"max_tokens", 16}, {"temperature", 0}};
    ClientResponse r = c.request("POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], want) << spec;
    ClientResponse m = c.request("GET", "/metrics", "");
    ASSERT_EQ(m.status, 200);
    const std::string key = "\nloom_spec_decode_accepted_tokens ";
    const size_t at = m.body.find(key);
    ASSERT_NE(at, std::string::npos) << m.body;
    EXPECT_GT(std::stod(m.body.substr(at + key.size())), 0) << spec << ": nothing accepted\n" << m.body;
    EXPECT_EQ(proc.stop(SIGTERM), 0);
    if (spec.rfind("draft", 0) == 0) {
      EXPECT_NE(proc.output().find("not fewer than the target's"), std::string::npos) << proc.output();
    }
  }
  fs::remove_all(dir);
}

// Sets element `index` of weight `name` to NaN in a checkpoint's model.safetensors and
// re-signs the manifest: what a run that diverged before its save leaves behind.
void poison_weight(const std::string& step_dir, const std::string& name, int64_t index) {
  const std::string file = step_dir + "/model.safetensors";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t head_bytes = 0;
  f.read(reinterpret_cast<char*>(&head_bytes), 8);
  std::string head(head_bytes, '\0');
  f.read(head.data(), std::streamsize(head_bytes));
  const json tensor = json::parse(head).at(name);
  ASSERT_EQ(tensor.at("dtype"), "F32");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  f.seekp(std::streamoff(8 + head_bytes + tensor.at("data_offsets")[0].get<uint64_t>() + uint64_t(index) * 4));
  f.write(reinterpret_cast<const char*>(&nan), 4);
  f.close();
  json manifest = json::parse(io::read_file(step_dir + "/manifest.json"));
  manifest["files"]["model.safetensors"]["crc32c"] = io::crc32c_hex(io::crc32c_file(file));
  io::write_file_atomic(step_dir + "/manifest.json", manifest.dump(2));
}

// Runs `loom ARGS` and returns its exit code and everything it printed.
std::pair<int, std::string> run_loom(const std::string& args) {
  const std::string cmd = std::string(LOOM_BINARY_DIR) + "/bin/loom " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(ServeCheckpoint, NanWeightsFailGenerateAndServeRequestsWithTheCause) {
  const std::string dir = loom::testing::temp_dir("serve_checkpoint_nan");
  const std::string step_dir = train_checkpoint(dir);
  ASSERT_FALSE(step_dir.empty());
  poison_weight(step_dir, "transformer.ln_f.weight", 0);  // every logit becomes NaN

  const auto [code, out] = run_loom("generate --checkpoint " + step_dir + " --prompt Hello --max-tokens 5 --threads 1");
  EXPECT_EQ(code, 1) << out;
  for (const char* part :
       {"[generate] the model's logits for position 5 (after 5 prompt and 0 generated tokens) are NaN",
        "holds 1 non-finite weight (first: 1 of the 32 values of transformer.ln_f.weight)",
        "use an earlier checkpoint"})
    EXPECT_NE(out.find(part), std::string::npos) << part << "\n" << out;

  ServerProcess proc({"--checkpoint", step_dir, "--threads", "1", "--kv-cache-mb", "4"});
  ASSERT_TRUE(proc.wait_ready()) << proc.output();
  HttpClient c("127.0.0.1", proc.port());
  json body = {{"model", "gpt2-tiny"}, {"prompt", "Hello"}, {"max_tokens", 5}};
  for (int i = 0; i < 2; ++i) {  // the server goes on answering
    ClientResponse r = c.request("POST", "/v1/completions", body.dump());
    EXPECT_EQ(r.status, 500) << r.body;
    const json err = json::parse(r.body)["error"];
    EXPECT_EQ(err["type"], "server_error");
    EXPECT_EQ(err["message"].get<std::string>().rfind("the model's logits for position 5 (after 5 prompt and 0 "
                                                      "generated tokens) are NaN",
                                                      0),
              0u)
        << r.body;
  }
  body["stream"] = true;
  ASSERT_EQ(c.start_stream("POST", "/v1/completions", body.dump()).status, 200);
  std::string last;
  while (auto ev = c.next_event()) last = *ev;
  EXPECT_NE(last.find("are NaN"), std::string::npos) << last;
  EXPECT_EQ(HttpClient("127.0.0.1", proc.port()).request("GET", "/health").status, 200);
  std::string m = HttpClient("127.0.0.1", proc.port()).request("GET", "/metrics").body;
  EXPECT_NE(m.find("loom_request_finished_total{finish_reason=\"error\"} 3"), std::string::npos) << m;
  EXPECT_EQ(proc.stop(SIGTERM), 0) << proc.output();
  EXPECT_NE(proc.output().find("failed: the model's logits"), std::string::npos) << proc.output();
  fs::remove_all(dir);
}

TEST(ServeGpt2Tokenizer, StreamsTokensAsValidText) {
  auto tok = make_text_tokenizer("gpt2");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eos_token(), 50256);
  const std::string text = "Héllo, wörld! 日本語 🙂";
  std::vector<int32_t> ids = tok->encode(text);
  EXPECT_LT(ids.size(), text.size());
  TextStream ts(*tok, {"wör"});
  std::string streamed;
  for (int32_t id : ids) {
    streamed += ts.push_token(id);
    if (ts.stopped()) break;
  }
  EXPECT_EQ(streamed, "Héllo, ");
  EXPECT_EQ(render_completion(*tok, ids, {}), text);
  EXPECT_THROW(tok->token_bytes(50257), loom::Error);
}

}  // namespace
}  // namespace loom::serve::testing
