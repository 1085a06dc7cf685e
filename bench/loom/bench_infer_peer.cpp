// `loom bench infer --peer llama.cpp`: loom's engine and llama.cpp (through PyPI's
// llama-cpp-python, built into a private venv by bench/peers/setup_llama_cpp.sh) on the same
// weights. A GPT-2 checkpoint or preset is written as GGUF by bench/peers/gguf_from_hf.py:
// fp32 against F32, int8 against Q8_0 and int4 against Q4_0, and greedy tokens must match at
// F32. A GGUF file is run as it is: llama.cpp at the file's own precision in every row, loom
// dequantized (fp32) and quantized on load; greedy tokens are then only counted. Batch-1
// decode and prompt processing alternate between the two in every round (a shared machine's
// load falls on both alike); greedy tokens run with llama.cpp's KV cache in F32 and flash
// attention off. --peer-isa avx2 builds llama.cpp for AVX2 only (a separate venv), to compare
// with loom under LOOM_ISA=avx2 as on an AVX2-only CPU. Perplexity on both sides:
// bench_infer_ppl.cpp.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "bench/loom/bench_infer.h"
#include "bench/loom/peer_process.h"
#include "loom/core/error.h"
#include "loom/core/stats.h"
#include "loom/core/timer.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/engine.h"
#include "loom/io/file.h"
#include "loom/io/gguf.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cpu/quant_linear.h"
#include "loom/model/hf_weights.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

const char* isa_name(PeerIsa isa) { return isa == PeerIsa::avx2 ? "avx2" : "native"; }

// build/bin/loom -> build/peers/llama-venv (llama-venv-avx2 for --peer-isa avx2): the peer
// lives beside the build that uses it, one venv per ISA.
std::string default_venv(PeerIsa isa) { return peer_venv_dir(isa == PeerIsa::avx2 ? "llama-venv-avx2" : "llama-venv"); }

// The instructions beyond AVX2+FMA+F16C that a loom kernel name implies ("AVX-512",
// "AVX-VNNI"), or "" when an AVX2-only CPU runs it: hot kernels avx512/avx2/base, quantized
// linears avx512-vnni, avx512-f32, avx512-bf16, avx-vnni, avx2-f32, base-f32.
std::string beyond_avx2(const std::string& kernel) {
  if (kernel.rfind("avx512", 0) == 0) return "AVX-512";
  if (kernel.find("vnni") != std::string::npos) return "AVX-VNNI";
  if (kernel.find("amx") != std::string::npos) return "AMX";
  return "";
}

// llama.cpp's system info lists the CPU features it was compiled with ("AVX2 = 1 | ..."); an
// avx2 peer listing wider ones, or a native one listing AMX, is a venv built otherwise (by
// hand, or an older script). AMX stays off: GCC 12 miscompiles llama.cpp's tile setup and its
// quantized models die with SIGSEGV (bench/peers/setup_llama_cpp.sh).
void check_peer_isa(PeerIsa isa, const std::string& ready, const std::string& venv) {
  if (isa != PeerIsa::avx2) {
    if (ready.find("AMX_INT8 = 1") != std::string::npos)
      throw Error(str_cat("[bench infer] llama.cpp in ", venv,
                          " was built with AMX, whose quantized path crashes "
                          "when GCC 12 compiles it; remove that directory and run again to rebuild it without AMX"));
    return;
  }
  for (const char* wide : {"AVX512", "AVX_VNNI", "AMX"})
    if (ready.find(wide) != std::string::npos)
      throw Error(str_cat("[bench infer] --peer-isa avx2, but llama.cpp in ", venv, " was built with ", wide,
                          " (its system info: ", ready, "); remove that directory and run again to rebuild it"));
}

void run_step(const std::string& cmd, const std::string& what) {
  const int rc = std::system(cmd.c_str());
  if (rc != 0)
    throw Error(str_cat("[bench infer] ", what, " failed (exit ", WIFEXITED(rc) ? WEXITSTATUS(rc) : rc,
                        "); its messages are above"));
}

// One precision both sides run: loom's --quant name and the GGUF types of the blocks and head
// (of the file llama.cpp runs as it is, when `file`).
struct Level {
  std::string loom, gguf, head;
  bool file = false;
  std::string peer_name() const {
    if (file) return gguf + " file";
    return gguf + (head != gguf ? " (head " + head + ")" : "");
  }
};

// What a GGUF file holds: the type of most of its matrix weights ("Q4_1"), its head's (the
// output matrix, else the tied token table) and a count per type ("Q4_1 x210, Q8_0 x1, F32 x61").
struct FileWeights {
  std::string main, head, detail;
};
FileWeights gguf_file_weights(const std::string& path) {
  const io::GgufFile f = io::GgufFile::open(path);
  std::map<std::string, std::pair<int64_t, int64_t>> by_type;  // tensors, matrix elements
  for (const io::GgufTensor& t : f.tensors()) {
    auto& [count, elems] = by_type[io::ggml_type_name(t.type)];
    ++count;
    if (t.ne.size() >= 2) elems += t.numel();
  }
  FileWeights w;
  int64_t most = -1;
  for (const auto& [type, ce] : by_type) {
    w.detail += str_cat(w.detail.empty() ? "" : ", ", type, " x", ce.first);
    if (ce.second > most) {
      most = ce.second;
      w.main = type;
    }
  }
  for (const char* head : {"output.weight", "token_embd.weight"})
    if (f.contains(head)) {
      w.head = io::ggml_type_name(f.tensor(head).type);
      break;
    }
  return w;
}

// llama.cpp's context for `needed` positions: the model's, but no longer than needed (a long
// context makes llama.cpp reserve compute buffers of n_ctx x n_ctx scores), and at least 1024.
int64_t peer_context(const model::ModelConfig& mc, int64_t needed) {
  return std::min<int64_t>(mc.n_ctx, std::max<int64_t>(1024, (needed + 255) / 256 * 256));
}

std::vector<int32_t> decode_prompt(int64_t P, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(P));
  for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 7 + 1) % size_t(vocab));
  return p;
}

// Batch-1 decode: a P-token prompt, then N greedy steps each timed; median rate.
double loom_decode_rate(infer::Engine& e, int64_t vocab, int64_t P, int64_t N) {
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = N + 1;
  e.add_request(decode_prompt(P, vocab), sp);
  e.step();  // the prompt and the first token
  std::vector<double> dt;
  while (e.has_unfinished()) {
    const double t = now_seconds();
    e.step();
    dt.push_back(now_seconds() - t);
  }
  return 1.0 / percentile(dt, 50);
}

constexpr const char* kComparePrompt = "ROMEO:\nBut soft, what light through yonder window breaks?\n";

// Control characters as escapes, so one sample stays on one line of the report.
std::string escaped(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n')
      o += "\\n";
    else if (c == '"' || c == '\\')
      o += str_cat("\\", char(c));
    else if (c < 0x20)
      o += str_cat("\\x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
    else
      o += char(c);
  }
  return o;
}

double read_number(PeerProcess& p, const std::string& prefix) {
  const std::string s = p.read_until(prefix);
  try {
    return std::stod(s);
  } catch (...) {
    throw Error(str_cat("[bench infer] llama.cpp peer: expected a number after ", prefix, ", got \"", s, "\""));
  }
}

struct LevelResult {
  Level level;
  std::string loom_precision, loom_linears;  // loom_linears: the quantized linears' path, "" at fp32
  double loom_decode = 0, peer_decode = 0, loom_prefill = 0, peer_prefill = 0;
  std::optional<Perplexity> ppl;
};

// Greedy tokens of loom's engine `e` and of llama.cpp (an F32 KV cache, no flash attention)
// after the same prompt.
struct GreedyComparison {
  std::vector<int32_t> prompt, mine, theirs;
  int64_t equal = 0, first_diff = -1;  // -1: identical
};
GreedyComparison compare_greedy(infer::Engine& e, const std::vector<std::string>& peer_argv,
                                std::vector<int32_t> prompt, int64_t n) {
  GreedyComparison g;
  g.prompt = std::move(prompt);
  PeerProcess exact(peer_argv);
  exact.read_until("READY ");
  infer::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = n;
  g.mine = e.generate(g.prompt, sp);
  std::string cmd = str_cat("greedy ", n);
  for (int32_t t : g.prompt) cmd += str_cat(" ", t);
  exact.send_line(cmd);
  std::istringstream is(exact.read_until("TOKENS "));
  for (int32_t t; is >> t;) g.theirs.push_back(t);
  exact.send_line("quit");
  for (size_t i = 0; i < g.mine.size() && i < g.theirs.size(); ++i) {
    if (g.mine[i] == g.theirs[i])
      ++g.equal;
    else if (g.first_diff < 0)
      g.first_diff = int64_t(i);
  }
  if (g.first_diff < 0 && g.mine.size() != g.theirs.size())
    g.first_diff = int64_t(std::min(g.mine.size(), g.theirs.size()));
  return g;
}

}  // namespace

int bench_infer_llama_cpp(const InferBenchOptions& a, const model::ModelConfig& mc, const std::string& checkpoint,
                          const infer::EngineConfig& engine_cfg, int threads, int64_t prefill) {
  // A GGUF file is run by llama.cpp as it is, whatever its architecture; other weights are
  // exported, which gguf_from_hf.py can do for GPT-2 only.
  const bool file = !checkpoint.empty() && model::model_format(checkpoint) == model::ModelFormat::gguf;
  if (!file && mc.family != model::Family::gpt2)
    throw UsageError(str_cat("[bench infer] --peer llama.cpp runs GPT-2-family models; ", mc.name, " is ",
                             model::family_name(mc.family),
                             " (use --model gpt2-124m or a GPT-2 checkpoint, or give a GGUF file: --model X.gguf)"));
  if (a.given("quant"))
    throw UsageError(
        "[bench infer] --peer llama.cpp runs every precision itself (fp32/F32, bf16/BF16, "
        "int8/Q8_0, int4/Q4_0); choose them with --precisions instead of --quant");
  const std::string venv = a.peer_venv.empty() ? default_venv(a.peer_isa) : a.peer_venv;
  const int64_t rounds = a.rounds, decode_tokens = a.batch1_tokens;
  const int64_t compare_tokens = a.compare_tokens;
  if (rounds < 1 || decode_tokens < 1 || compare_tokens < 0)
    throw UsageError("[bench infer] --rounds and --batch1-tokens must be >= 1, --compare-tokens >= 0");
  const uint64_t seed = uint64_t(a.seed);
  std::string ppl_text;
  if (!a.ppl_text.empty()) {
    if (checkpoint.empty())
      throw UsageError(
          "[bench infer] --ppl-text needs a model with a tokenizer (--model X.gguf or --checkpoint DIR), "
          "not a preset's random weights");
    if (a.ppl_seq_len < 1 || a.ppl_seq_len > mc.n_ctx)
      throw UsageError(
          str_cat("[bench infer] --ppl-seq-len ", a.ppl_seq_len, ": expected 1 to the model's context of ", mc.n_ctx));
    if (!fs::is_regular_file(a.ppl_text))
      throw UsageError("[bench infer] --ppl-text " + a.ppl_text + " is not a file; give a text file to score");
    ppl_text = io::read_file(a.ppl_text);
  }

  // The precisions: fp32 F32, int8 Q8_0 (its head Q8_0 too), int4 Q4_0 with the head as loom
  // keeps it (int8 by default: Q8_0; --quant-head f32: F32); against a GGUF file, its own.
  const bool head_f32 = a.quant.head == "f32";
  const FileWeights fw = file ? gguf_file_weights(checkpoint) : FileWeights{};
  std::vector<Level> levels;
  {
    std::istringstream is(a.precisions);
    std::string p;
    while (std::getline(is, p, ',')) {
      if (file && (p == "fp32" || p == "bf16" || p == "int8" || p == "int4"))
        levels.push_back({p, fw.main, fw.head, true});
      else if (p == "fp32")
        levels.push_back({"fp32", "F32", "F32"});
      else if (p == "bf16")
        levels.push_back({"bf16", "BF16", head_f32 ? "F32" : "BF16"});
      else if (p == "int8")
        levels.push_back({"int8", "Q8_0", head_f32 ? "F32" : "Q8_0"});
      else if (p == "int4")
        levels.push_back({"int4", "Q4_0", head_f32 ? "F32" : "Q8_0"});
      else
        throw UsageError("[bench infer] --precisions: \"" + p + "\" is not fp32, bf16, int8 or int4 (a comma list)");
    }
    if (levels.empty()) throw UsageError("[bench infer] --precisions names no precision");
  }

  auto level_spec = [&](const Level& l) {
    return l.loom == "fp32"
               ? std::optional<infer::QuantSpec>()
               : infer::parse_quant_spec(l.loom, l.loom == "int4" ? a.quant.group : -1, head_f32 ? "f32" : "int8",
                                         l.loom == "int4" && a.quant.zero_point);
  };
  // loom's kernels per level: the f32 ones (attention, norms, fp32 linears) and the quantized
  // linears' path, as LOOM_ISA and the CPU choose them.
  const std::string loom_isa = cpu::hot_kernels_isa();
  std::vector<std::string> loom_linears;  // "" at fp32
  for (const Level& l : levels) {
    const auto spec = level_spec(l);
    loom_linears.push_back(spec ? cpu::quant_linear_path(spec->format) : "");
  }

  const std::string setup = std::string(LOOM_SOURCE_DIR) + "/bench/peers/setup_llama_cpp.sh";
  run_step(str_cat("bash ", shell_quoted(setup), " ", shell_quoted(venv), " ", isa_name(a.peer_isa)),
           str_cat("building the llama.cpp peer for ISA ", isa_name(a.peer_isa), " (", setup, ")"));
  const std::string python = venv + "/bin/python";
  const std::string peer_script = std::string(LOOM_SOURCE_DIR) + "/bench/peers/llama_cpp_peer.py";

  // The f32 weights, exported in Hugging Face layout, then written as GGUF per precision.
  const fs::path work = fs::path(venv).parent_path() / str_cat("run-", getpid());
  struct Cleanup {  // LOOM_KEEP_PEER_FILES=1 keeps the GGUF files (to run llama.cpp on them by hand)
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      if (!fs::exists(p, ec)) return;
      if (const char* k = std::getenv("LOOM_KEEP_PEER_FILES"); k && std::string(k) == "1")
        std::fprintf(stderr, "[bench infer] kept the GGUF files in %s\n", p.c_str());
      else
        fs::remove_all(p, ec);
    }
  } cleanup{work};
  auto load = [&](const std::optional<infer::QuantSpec>& q) { return bench_model(checkpoint, mc, seed, q, stderr); };
  std::vector<std::string> ggufs;
  if (file) {
    ggufs.assign(levels.size(), checkpoint);
  } else {
    fs::create_directories(work / "hf");
    {
      const InferenceModel f32 = load(std::nullopt);
      model::save_hf_pretrained(*f32.model, (work / "hf").string());
    }
    const char* data_dir = std::getenv("LOOM_DATA_DIR");
    const std::string vocab = data_dir ? std::string(data_dir) + "/gpt2" : std::string(LOOM_SOURCE_DIR) + "/data/gpt2";
    const std::string writer = std::string(LOOM_SOURCE_DIR) + "/bench/peers/gguf_from_hf.py";
    for (const Level& l : levels) {
      ggufs.push_back((work / (l.gguf + "-head-" + l.head + ".gguf")).string());
      run_step(str_cat(shell_quoted(python), " ", shell_quoted(writer), " --hf ", shell_quoted((work / "hf").string()),
                       " --out ", shell_quoted(ggufs.back()), " --type ", l.gguf, " --head-type ", l.head, " --vocab ",
                       shell_quoted(vocab)),
               "writing " + ggufs.back());
    }
    fs::remove_all(work / "hf");
  }

  infer::EngineConfig cfg = engine_cfg;
  cfg.max_num_seqs = 1;
  cfg.prefix_caching = false;
  cfg.max_batched_tokens = std::max<int64_t>(cfg.max_batched_tokens, prefill);
  const int64_t P = 16;
  const int64_t timing_ctx = peer_context(mc, std::max(P + decode_tokens + 1, prefill + 1));
  std::printf(
      "peer: llama.cpp via llama-cpp-python built for %s in %s, %d threads, alternating with loom; %lld rounds "
      "of %lld decode steps after a %lld-token prompt, and one %lld-token prompt\n",
      a.peer_isa == PeerIsa::avx2 ? "AVX2 (--peer-isa avx2: AVX2, FMA, F16C; no AVX-512, AVX-VNNI or AMX)"
                                  : "this CPU (--peer-isa native: -march=native)",
      venv.c_str(), threads, (long long)rounds, (long long)decode_tokens, (long long)P, (long long)prefill);
  if (a.peer_isa == PeerIsa::avx2) {
    // Like for like means loom within the peer's instructions too.
    std::string wider;
    if (const std::string w = beyond_avx2(loom_isa); !w.empty()) wider = str_cat("kernels ", loom_isa, " (", w, ")");
    std::map<std::string, std::string> levels_by_path;  // "avx-vnni" -> "int8, int4"
    for (size_t li = 0; li < levels.size(); ++li)
      if (!beyond_avx2(loom_linears[li]).empty()) {
        std::string& names = levels_by_path[loom_linears[li]];
        names += str_cat(names.empty() ? "" : ", ", levels[li].loom);
      }
    for (const auto& [path, names] : levels_by_path)
      wider += str_cat(wider.empty() ? "" : "; ", names, " linears ", path, " (", beyond_avx2(path), ")");
    if (!beyond_avx2(loom_isa).empty())
      std::printf(
          "note: loom runs wider instructions than the peer's AVX2 build: %s; run with LOOM_ISA=avx2 "
          "LOOM_QUANT_PATH=avx2-int (LOOM_ISA=avx2 LOOM_QUANT_PATH=avx2-int loom bench infer --peer llama.cpp "
          "--peer-isa avx2 ...) to compare like for like\n",
          wider.c_str());
    else if (!wider.empty())  // LOOM_ISA=avx2 keeps AVX-VNNI where the CPU has it; LOOM_QUANT_PATH does not
      std::printf(
          "note: loom's %s: instructions this CPU has but the peer's AVX2 build, and an AVX2-only CPU such as "
          "Zen 3, lack; add LOOM_QUANT_PATH=avx2-int to compare like for like\n",
          wider.c_str());
  } else if (const char* forced = std::getenv("LOOM_ISA"); forced && loom_isa != "avx512") {
    std::printf(
        "note: loom's kernels are held to LOOM_ISA=%s (%s) while the peer is built for all of this CPU's "
        "instructions; add --peer-isa avx2 to compare like for like\n",
        forced, loom_isa.c_str());
  }
  if (file)
    std::printf(
        "peer weights: %s as it is, in every row: %s (head %s); loom keeps its Q8_0/Q4_0/Q4_1 blocks "
        "where the row's format holds them and quantizes the rest from f32 (its [quant] line says which)\n",
        checkpoint.c_str(), fw.detail.c_str(), fw.head.c_str());
  std::fflush(stdout);

  std::vector<LevelResult> results;
  std::optional<GreedyComparison> greedy;
  std::optional<PplWindows> windows;
  for (size_t li = 0; li < levels.size(); ++li) {
    const Level& l = levels[li];
    const InferenceModel im = load(level_spec(l));
    cfg.quant = im.quant_ptr();
    infer::Engine e(*im.model, cfg);
    PeerProcess peer({python, peer_script, "--gguf", ggufs[li], "--threads", std::to_string(threads), "--ctx",
                      std::to_string(timing_ctx)});
    const std::string ready = peer.read_until("READY ");
    if (li == 0) {
      std::printf("peer: %s\n", ready.c_str());
      check_peer_isa(a.peer_isa, ready, venv);
    }
    LevelResult r;
    r.level = l;
    r.loom_precision = im.precision();
    r.loom_linears = loom_linears[li];
    if (r.loom_linears.empty())
      std::printf("  loom %s: kernels %s; llama.cpp %s\n", r.loom_precision.c_str(), loom_isa.c_str(),
                  l.peer_name().c_str());
    else
      std::printf("  loom %s: quantized linears %s, other kernels %s; llama.cpp %s\n", r.loom_precision.c_str(),
                  r.loom_linears.c_str(), loom_isa.c_str(), l.peer_name().c_str());
    std::vector<double> ld, pd, lp, pp;
    loom_decode_rate(e, mc.vocab_size, P, 4);  // warm-up: first touches of weights and caches
    peer.send_line(str_cat("decode ", P, " 4"));
    read_number(peer, "DECODE ");
    for (int64_t round = 0; round < rounds; ++round) {
      ld.push_back(loom_decode_rate(e, mc.vocab_size, P, decode_tokens));
      peer.send_line(str_cat("decode ", P, " ", decode_tokens));
      pd.push_back(read_number(peer, "DECODE "));
      if (prefill > 0) {
        peer.send_line(str_cat("prefill ", prefill));
        pp.push_back(read_number(peer, "PREFILL "));
        lp.push_back(time_prefill(e, mc.vocab_size, prefill, int(round)));
      }
      std::printf("  %s / %s round %lld: decode loom %.1f, llama.cpp %.1f tokens/s", r.loom_precision.c_str(),
                  l.peer_name().c_str(), (long long)round + 1, ld.back(), pd.back());
      if (prefill > 0) std::printf("; prompt loom %.0f, llama.cpp %.0f tokens/s", lp.back(), pp.back());
      std::printf("\n");
      std::fflush(stdout);
    }
    peer.send_line("quit");
    r.loom_decode = percentile(ld, 50);
    r.peer_decode = percentile(pd, 50);
    if (prefill > 0) {
      r.loom_prefill = percentile(lp, 50);
      r.peer_prefill = percentile(pp, 50);
    }

    if (!ppl_text.empty()) {
      if (!windows) {
        const auto tok = data::make_tokenizer(im.tokenizer);
        windows.emplace(tok->encode(ppl_text), a.ppl_seq_len, a.ppl_max_windows);
        std::printf("perplexity: %s, %zu tokens (%s tokenizer), %lld windows of up to %lld tokens, %lld scored\n",
                    a.ppl_text.c_str(), windows->ids.size(), tok->name().c_str(), (long long)windows->windows,
                    (long long)windows->T, (long long)windows->scored());
      }
      const Stopwatch sw;
      r.ppl = loom_perplexity(im, *windows);
      std::printf("  %s: loom perplexity %.4f (%.1f s)\n", r.loom_precision.c_str(), r.ppl->ppl(), sw.seconds());
      std::fflush(stdout);
    }
    results.push_back(r);

    if (l.loom == "fp32" && compare_tokens > 0) {
      // A text prompt through the model's tokenizer (real text gives a less degenerate
      // continuation than the timing runs' token formula, which random weights get).
      std::vector<int32_t> prompt = decode_prompt(P, mc.vocab_size);
      std::unique_ptr<data::Tokenizer> tok;
      if (!im.tokenizer.empty()) {
        tok = data::make_tokenizer(im.tokenizer);
        prompt = tok->encode(a.given("compare-prompt") ? a.compare_prompt : std::string(kComparePrompt));
        if (prompt.empty()) throw UsageError("[bench infer] --compare-prompt is empty; give some text to continue");
      }
      const int64_t ctx = peer_context(mc, int64_t(prompt.size()) + compare_tokens + 1);
      greedy = compare_greedy(e,
                              {python, peer_script, "--gguf", ggufs[li], "--threads", std::to_string(threads), "--ctx",
                               std::to_string(ctx), "--exact"},
                              prompt, compare_tokens);
      const GreedyComparison& g = *greedy;
      const int64_t agree = g.first_diff < 0 ? int64_t(g.mine.size()) : g.first_diff;
      std::string ms, ts;
      for (int32_t t : g.mine) ms += str_cat(" ", t);
      for (int32_t t : g.theirs) ts += str_cat(" ", t);
      if (file)
        std::printf(
            "greedy tokens, loom fp32 against llama.cpp on the %s file (%lld after a %zu-token prompt; a count, "
            "not an exactness check: llama.cpp multiplies %s weights with 8-bit activations): the first %lld "
            "agree, %lld equal in all\n  loom:     %s\n  llama.cpp:%s\n",
            l.gguf.c_str(), (long long)compare_tokens, g.prompt.size(), l.gguf.c_str(), (long long)agree,
            (long long)g.equal, ms.c_str(), ts.c_str());
      else
        std::printf(
            "greedy tokens at F32 (%lld after a %zu-token prompt): %lld equal%s\n  loom:     %s\n  "
            "llama.cpp:%s\n",
            (long long)compare_tokens, g.prompt.size(), (long long)g.equal,
            g.first_diff < 0 ? ", identical" : str_cat(", first difference at ", g.first_diff).c_str(), ms.c_str(),
            ts.c_str());
      if (tok)
        std::printf("  as text (%s tokenizer): \"%s\" + \"%s\"\n", im.tokenizer.c_str(),
                    escaped(tok->decode(g.prompt)).c_str(), escaped(tok->decode(g.mine)).c_str());
    }
  }

  // llama.cpp's perplexity: once, on the file (or, exported, on the first precision's GGUF),
  // every position's logits kept, its KV cache in F32 as loom's.
  std::optional<Perplexity> peer_ppl;
  if (windows) {
    PeerProcess scorer({python, peer_script, "--gguf", ggufs[0], "--threads", std::to_string(threads), "--ctx",
                        std::to_string(peer_context(mc, windows->T + 1)), "--exact", "--logits-all"});
    scorer.read_until("READY ");
    const Stopwatch sw;
    peer_ppl = peer_perplexity(scorer, *windows);
    scorer.send_line("quit");
    std::printf("  llama.cpp (%s): perplexity %.4f (%.1f s)\n", levels[0].peer_name().c_str(), peer_ppl->ppl(),
                sw.seconds());
  }

  const std::string peer_head = file ? "llama.cpp (" + fw.main + " file)" : "llama.cpp";
  std::printf("\n%-44s%12s%12s%9s%12s%12s%9s\n", ("precision (loom / " + peer_head + ")").c_str(), "decode loom",
              "llama.cpp", "ratio", "prompt loom", "llama.cpp", "ratio");
  std::string js = str_cat("{\"model\":\"", mc.name, "\",\"peer\":\"llama.cpp\",\"threads\":", threads,
                           ",\"prefill_tokens\":", prefill, ",\"rounds\":", rounds, ",\"peer_isa\":\"",
                           isa_name(a.peer_isa), "\",\"loom_isa\":\"", loom_isa, "\"");
  if (file)
    js += str_cat(",\"peer_weights\":\"", fw.main, " file\",\"peer_weights_detail\":\"", fw.detail, "\",\"gguf\":\"",
                  escaped(checkpoint), "\"");
  for (const LevelResult& r : results) {
    const std::string name = r.loom_precision + " / " + r.level.peer_name();
    std::printf("%-44s%12.1f%12.1f%8.2fx%12.0f%12.0f%8.2fx\n", name.c_str(), r.loom_decode, r.peer_decode,
                r.loom_decode / r.peer_decode, r.loom_prefill, r.peer_prefill,
                r.peer_prefill > 0 ? r.loom_prefill / r.peer_prefill : 0.0);
    const std::string k = r.level.loom;
    if (!r.loom_linears.empty()) js += str_cat(",\"", k, "_loom_linears\":\"", r.loom_linears, "\"");
    js += str_cat(",\"", k, "_batch1_tokens_per_s\":", r.loom_decode, ",\"", k,
                  "_peer_batch1_tokens_per_s\":", r.peer_decode, ",\"", k,
                  "_batch1_ratio\":", r.loom_decode / r.peer_decode);
    if (prefill > 0)
      js += str_cat(",\"", k, "_prefill_tokens_per_s\":", r.loom_prefill, ",\"", k,
                    "_peer_prefill_tokens_per_s\":", r.peer_prefill, ",\"", k,
                    "_prefill_ratio\":", r.loom_prefill / r.peer_prefill);
  }
  std::printf("ratio: loom / llama.cpp (medians over rounds; >1: loom faster)\n");
  if (greedy)
    js += str_cat(",\"greedy_tokens_compared\":", compare_tokens, ",\"greedy_tokens_equal\":", greedy->equal,
                  ",\"greedy_first_difference\":", greedy->first_diff);
  if (windows && peer_ppl) {
    const LevelResult* fp32 = nullptr;
    for (const LevelResult& r : results)
      if (r.level.loom == "fp32") fp32 = &r;
    std::printf("\nperplexity (%lld tokens in %lld windows of up to %lld; same ids on both sides)\n",
                (long long)windows->scored(), (long long)windows->windows, (long long)windows->T);
    std::printf("%-44s%12s%14s%12s\n", "loom", "perplexity", "/ llama.cpp", "/ loom fp32");
    for (const LevelResult& r : results) {
      std::printf("%-44s%12.4f%13.4fx", r.loom_precision.c_str(), r.ppl->ppl(), r.ppl->ppl() / peer_ppl->ppl());
      if (fp32)
        std::printf("%11.4fx\n", r.ppl->ppl() / fp32->ppl->ppl());
      else
        std::printf("%12s\n", "-");
      const std::string k = r.level.loom;
      js += str_cat(",\"", k, "_ppl\":", r.ppl->ppl(), ",\"", k, "_loss\":", r.ppl->loss(), ",\"", k,
                    "_ppl_ratio\":", r.ppl->ppl() / peer_ppl->ppl());
      if (fp32) js += str_cat(",\"", k, "_ppl_vs_fp32\":", r.ppl->ppl() / fp32->ppl->ppl());
    }
    std::printf("%-44s%12.4f\n", peer_head.c_str(), peer_ppl->ppl());
    js += str_cat(",\"peer_ppl\":", peer_ppl->ppl(), ",\"peer_loss\":", peer_ppl->loss(),
                  ",\"ppl_tokens\":", windows->scored(), ",\"ppl_windows\":", windows->windows,
                  ",\"ppl_seq_len\":", windows->T);
  }
  js += "}";
  std::printf("SUMMARY %s\n", js.c_str());
  return 0;
}

}  // namespace loom::cli
