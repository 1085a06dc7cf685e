// The ranks of `loom bench finetune`: each loads the f32 model the command wrote, takes its share
// of the command's tokens, and times full fine-tuning steps under data parallelism (ZeRO-0, as
// PyTorch's DDP: every rank holds the weights, gradients and Adam moments; gradient buckets
// all-reduced during backward). Its figures go to WORK_DIR/rank<R>.json; the comparison is the
// command's (bench_finetune.cpp).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "bench/loom/bench_finetune.h"
#include "loom/comm/world.h"
#include "loom/core/threads.h"
#include "loom/core/timer.h"
#include "loom/io/file.h"
#include "loom/model/decoder.h"
#include "loom/model/hf_weights.h"
#include "loom/model/model_source.h"
#include "loom/parallel/data_parallel.h"
#include "loom/parallel/mesh.h"

namespace loom::cli {

namespace fs = std::filesystem;

std::string finetune_rank_file(const std::string& work_dir, int rank) {
  return (fs::path(work_dir) / str_cat("rank", rank, ".json")).string();
}

namespace {

// A field of /proc/self/status in bytes (VmRSS: resident now; VmHWM: its high-water mark).
int64_t proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::regex re(str_cat("^", field, ":\\s+(\\d+) kB"));
  std::smatch m;
  for (std::string line; std::getline(in, line);)
    if (std::regex_search(line, m, re)) return std::stoll(m[1].str()) * 1024;
  return 0;
}

// Sets the resident-set high-water mark to the current resident set (Linux 4.0+, clear_refs
// value 5), so that VmHWM afterwards is the peak of the steps alone, not of loading the model.
// The peer does the same (bench/peers/torch_finetune.py): the two peaks measure the same span.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

std::vector<int32_t> read_tokens(const std::string& path, size_t count) {
  const std::string bytes = io::read_file(path);
  LOOM_CHECK(bytes.size() >= count * sizeof(int32_t), "bench finetune", path, " holds ", bytes.size() / sizeof(int32_t),
             " tokens; the ranks need ", count);
  std::vector<int32_t> tokens(count);
  std::memcpy(tokens.data(), bytes.data(), count * sizeof(int32_t));
  return tokens;
}

}  // namespace

int bench_finetune_rank(const FinetuneBenchOptions& o, FinetuneMode mode) {
  comm::World world;
  const int N = world.size(), rank = world.rank();
  const int64_t B = o.batch, M = o.micro_batch > 0 ? o.micro_batch : B, T = o.seq;
  const int threads = std::max(1, int(o.threads > 0 ? o.threads : num_threads()) / N);
  set_num_threads(threads);
  const std::string model_dir = (fs::path(o.work_dir) / kFinetuneModelDir).string();
  const model::ModelCard card = model::read_model_card(model_dir);
  // Rank r's rows: the token stream from r*B*T on, each target the next token.
  const std::vector<int32_t> stream =
      read_tokens((fs::path(o.work_dir) / kFinetuneTokensFile).string(), size_t(N * B * T + 1));
  const int32_t* tok = stream.data() + rank * B * T;
  const int32_t* tgt = tok + 1;

  const optim::AdamWConfig adam{3e-5, 0.9, 0.99, 1e-8, 0.0};  // configs/finetune-smollm2.yaml's
  parallel::Mesh mesh(world.group(), parallel::MeshShape(1, N, 1, 1));
  // LoRA: rank-8 adapters (alpha 16) on q_proj and v_proj beside the frozen model, as the peer's.
  model::ModelConfig cfg = card.config;
  model::ModelSlice slice;
  if (mode == FinetuneMode::lora) {
    cfg.lora.rank = 8;
    cfg.lora.alpha = 16;
    cfg.lora.targets = {model::LoraTarget::q, model::LoraTarget::v};
    slice.lora_adapters = true;
  }
  const parallel::DataParallelPlan plan =
      parallel::plan_data_parallel({0, 25.0}, adam.kind, model::ParamLayout(cfg, N, slice), {N, N});
  model::DecoderOptions dopt = plan.decoder_options({});
  dopt.slice = slice;
  model::Decoder m(cfg, dopt);
  if (mode == FinetuneMode::lora) {
    model::load_hf_safetensors(cfg, m.base_layout(), m.base_params(),
                               (fs::path(model_dir) / "model.safetensors").string());
    m.init_weights(1234);
  } else {
    model::load_model_weights(model_dir, card, m);
  }
  parallel::DataParallel engine(m, mesh.dp(), adam, plan.options, 1234);

  const bool peak_reset = reset_peak_rss();
  const int64_t rss_start = proc_status_bytes("VmRSS");
  std::vector<double> step_ms, loss;
  std::vector<int32_t> mtok(size_t(M * T)), mtgt(size_t(M * T));
  for (int64_t i = 0; i < o.warmup + o.steps; ++i) {
    mesh.dp().barrier();
    Stopwatch sw;
    engine.zero_grads();
    double loss_sum = 0;
    for (int64_t b0 = 0; b0 < B; b0 += M) {
      engine.set_sync(b0 + M >= B);  // only the last micro-batch communicates
      loss_sum += m.forward_backward(tok + b0 * T, tgt + b0 * T, M, T, 1.0 / double(B * T * N));
    }
    engine.finish_grads();
    const double norm = std::sqrt(engine.grad_norm_sq());
    if (norm > 1.0) engine.scale_grads(float(1.0 / norm));
    engine.step(adam.lr);
    const double ms = sw.ms();
    loss.push_back(loss_sum / double(B * T));
    if (i >= o.warmup) step_ms.push_back(ms);
    if (rank == 0) {
      std::printf("loom dp=%d %s %lld: %.1f ms, loss %.4f (rank 0's rows)\n", N, i < o.warmup ? "warm-up" : "step",
                  (long long)(i < o.warmup ? i + 1 : i - o.warmup + 1), ms, loss.back());
      std::fflush(stdout);
    }
  }
  const MemorySnapshot snap = cpu_allocator().snapshot();
  const nlohmann::json figures = {
      {"rank", rank},
      {"dp", N},
      {"threads", threads},
      {"params", m.num_params()},
      {"mode", finetune_mode_name(mode)},
      {"step_ms", step_ms},
      {"loss", loss},
      {"rss_start_bytes", rss_start},
      {"rss_peak_bytes", proc_status_bytes("VmHWM")},
      {"rss_peak_is_steps_only", peak_reset},
      {"alloc_peak_bytes", snap.total.peak},
      {"model_state_bytes",
       snap[MemCategory::params].current + snap[MemCategory::grads].current + snap[MemCategory::optimizer].current}};
  if (!o.work_dir.empty()) io::write_file_atomic(finetune_rank_file(o.work_dir, rank), figures.dump() + "\n");
  return 0;
}

}  // namespace loom::cli
