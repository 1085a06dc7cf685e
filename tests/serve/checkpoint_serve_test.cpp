// `loom serve --checkpoint`: a checkpoint written by a few steps of the trainer is found (run
// directory -> newest valid step), verified, loaded, and served with the same outputs as an
// offline engine on those weights; a corrupt one is refused with the reason. Also the GPT-2
// tokenizer behind the server's streaming interface.
#include <filesystem>
#include <fstream>

#include "loom/infer/engine.h"
#include "loom/model/decoder.h"
#include "loom/serve/infer_engine.h"
#include "loom/train/checkpoint.h"
#include "loom/train/dataset_source.h"
#include "loom/train/trainer.h"
#include "train/train_testing.h"
#include "serve/server_fixture.h"
#include "serve/server_process.h"

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

TEST(ServeCheckpoint, ServesTheTrainedWeights) {
  const std::string dir = loom::testing::temp_dir("serve_checkpoint");
  const std::string step_dir = train_checkpoint(dir);
  ASSERT_FALSE(step_dir.empty());
  const model::ModelConfig mc = train::checkpoint_model_config(step_dir);
  model::Decoder model(mc);
  train::load_checkpoint_weights(step_dir, model);

  ByteTokenizer tok;
  GenerationRequest g;
  g.prompt = tok.encode("Hello");
  g.max_tokens = 20;
  g.sampling.temperature = 0;
  infer::EngineConfig ec;
  ec.kv_cache_bytes = 4 << 20;
  auto greedy_text = [&](const model::Decoder& m) {
    infer::Engine offline(m, ec);
    return render_completion(tok, offline.generate(g.prompt, to_infer_params(g, -1)), {});
  };
  const std::string want = greedy_text(model);
  model::Decoder other(mc);  // the weights the server would have without the checkpoint
  other.init_weights(1337);
  ASSERT_NE(greedy_text(other), want);

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
