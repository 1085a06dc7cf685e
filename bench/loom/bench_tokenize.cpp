// `loom bench tokenize`: encode and decode throughput (MB/s of text, one thread) of any tokenizer
// make_tokenizer opens, on a text file (Tiny Shakespeare by default), beside Hugging Face
// `tokenizers` on the same text in the same invocation (bench/peers/hf_tokenizers_peer.py, in a
// private venv that bench/peers/setup_tokenizers.sh makes): runs alternate, figures are medians,
// and the two id sequences are compared. Ends with a SUMMARY line.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include <unistd.h>

#include "bench/loom/bench.h"
#include "bench/loom/peer_process.h"
#include "loom/core/error.h"
#include "loom/core/stats.h"
#include "loom/core/timer.h"
#include "loom/data/tokenizer.h"

namespace loom::cli {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LOOM_CHECK(f.good(), "bench tokenize", "cannot read ", path, "; pass --input FILE");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The peer's --tokenizer for loom's spec, or "" with `why` set when HF has no counterpart.
std::string peer_spec(const std::string& spec, const std::string& data_dir, std::string& why) {
  if (spec == "byte") {
    why = "HF tokenizers has no byte tokenizer to compare with";
    return "";
  }
  if (spec == "gpt2") {
    const std::string root = data_dir.empty() ? data::default_data_dir() : data_dir;
    return "gpt2:" + (std::filesystem::exists(root + "/encoder.json") ? root : root + "/gpt2");
  }
  return spec;
}

// HF tokenizers in its venv, ready to encode `input`; null (after one line saying why) when it
// cannot be installed or cannot rebuild this tokenizer.
std::unique_ptr<PeerProcess> start_peer(const std::string& venv, const std::string& spec, const std::string& input) {
  const std::string setup = std::string(LOOM_SOURCE_DIR) + "/bench/peers/setup_tokenizers.sh";
  const int rc = std::system(("bash " + shell_quoted(setup) + " " + shell_quoted(venv)).c_str());
  if (rc != 0) {
    std::printf("peer: HF tokenizers skipped: %s could not make its venv (message above)\n", setup.c_str());
    return nullptr;
  }
  try {
    auto peer = std::make_unique<PeerProcess>(std::vector<std::string>{
        venv + "/bin/python", std::string(LOOM_SOURCE_DIR) + "/bench/peers/hf_tokenizers_peer.py", "--tokenizer", spec,
        "--input", input});
    peer->read_until("READY");
    return peer;
  } catch (const std::exception& e) {
    std::printf("peer: HF tokenizers skipped: %s\n", e.what());
    return nullptr;
  }
}

struct PeerTimes {
  std::vector<double> cold_s, warm_s, batch_s;
  size_t tokens = 0, batch_tokens = 0;
};

void run_peer_once(PeerProcess& peer, PeerTimes& t) {
  peer.send_line("encode");
  std::istringstream enc(peer.read_until("TIMES "));
  double cold = 0, warm = 0;
  enc >> cold >> warm >> t.tokens;
  t.cold_s.push_back(cold);
  t.warm_s.push_back(warm);
  peer.send_line("batch");
  std::istringstream batch(peer.read_until("BATCH "));
  double b = 0;
  batch >> b >> t.batch_tokens;
  t.batch_s.push_back(b);
}

std::vector<int32_t> peer_ids(PeerProcess& peer, const std::string& venv) {
  const std::string path = str_cat(venv, "/ids-", getpid(), ".bin");
  peer.send_line("ids " + path);
  peer.read_until("WROTE ");
  std::ifstream f(path, std::ios::binary);
  std::vector<int32_t> ids;
  int32_t v = 0;
  while (f.read(reinterpret_cast<char*>(&v), sizeof v)) ids.push_back(v);
  std::filesystem::remove(path);
  return ids;
}

}  // namespace

int bench_tokenize(const std::vector<std::string>& argv) {
  auto app = bench_app("tokenize");
  std::string spec = "gpt2", path = data::default_data_dir() + "/tinyshakespeare/input.txt", data_dir, peer_name, venv;
  int64_t repeats = 5;
  peer_name = "hf-tokenizers";
  app->add_option("--tokenizer", spec, "gpt2, byte, or a path: a .gguf model, a tokenizer.json or a folder holding one")
      ->type_name("SPEC");
  app->add_option("--input", path, "the text to encode")->type_name("FILE");
  app->add_option("--repeats", repeats, "runs (alternating with the peer's); figures are medians")->check(positive());
  app->add_option("--data-dir", data_dir, "folder holding gpt2/encoder.json and gpt2/vocab.bpe")->type_name("DIR");
  app->add_option("--peer", peer_name, "also run Hugging Face tokenizers (one thread) on the same text, or none")
      ->check(one_of({"hf-tokenizers", "none"}));
  app->add_option("--peer-venv", venv, "where the peer's venv is made (default BUILD/peers/tokenizers-venv)")
      ->type_name("DIR");
  if (auto rc = parse(*app, argv)) return *rc;
  const std::string text = read_text(path);
  const double mb = double(text.size()) / 1e6;
  if (venv.empty()) venv = peer_venv_dir("tokenizers-venv");

  std::unique_ptr<PeerProcess> peer;
  if (peer_name != "none") {
    std::string why;
    const std::string pspec = peer_spec(spec, data_dir, why);
    if (pspec.empty())
      std::printf("peer: HF tokenizers skipped: %s\n", why.c_str());
    else
      peer = start_peer(venv, pspec, path);
  }

  // Cold: a fresh tokenizer (empty word cache) per repeat, as `loom prepare` sees it; then warm.
  std::vector<double> load_s, cold_s, warm_s, decode_s;
  PeerTimes hf;
  std::vector<int32_t> ids;
  std::string back;
  for (int64_t r = 0; r < repeats; ++r) {
    Stopwatch load;
    auto tok = data::make_tokenizer(spec, data_dir);
    load_s.push_back(load.seconds());
    Stopwatch cold;
    ids = tok->encode(text);
    cold_s.push_back(cold.seconds());
    Stopwatch warm;
    ids = tok->encode(text);
    warm_s.push_back(warm.seconds());
    Stopwatch dec;
    back = tok->decode(ids);
    decode_s.push_back(dec.seconds());
    if (peer) run_peer_once(*peer, hf);
  }
  const bool round_trip = back == text;
  std::printf("bench tokenize: %s on %s (%.2f MB -> %zu tokens, %.2f bytes/token), median of %lld, 1 thread\n",
              spec.c_str(), path.c_str(), mb, ids.size(), double(text.size()) / double(std::max<size_t>(1, ids.size())),
              (long long)repeats);
  std::printf("  load     %8.1f ms\n", median(load_s) * 1e3);
  std::printf("  encode   %8.2f MB/s  (cold word cache; %.2f MB/s warm)\n", mb / median(cold_s), mb / median(warm_s));
  std::printf("  decode   %8.2f MB/s\n", mb / median(decode_s));
  std::printf("  round trip: %s\n", round_trip ? "exact" : "differs");
  nlohmann::json summary = {{"tokenizer", spec},
                            {"input_bytes", text.size()},
                            {"tokens", ids.size()},
                            {"repeats", repeats},
                            {"encode_mb_per_s", mb / median(cold_s)},
                            {"encode_warm_mb_per_s", mb / median(warm_s)},
                            {"decode_mb_per_s", mb / median(decode_s)},
                            {"load_ms", median(load_s) * 1e3},
                            {"round_trip", round_trip}};
  bool ids_equal = true;
  if (peer) {
    const std::vector<int32_t> hf_ids = peer_ids(*peer, venv);
    ids_equal = hf_ids == ids;
    size_t first = 0;
    while (first < ids.size() && first < hf_ids.size() && ids[first] == hf_ids[first]) ++first;
    const double hf_mb_s = mb / median(hf.cold_s), hf_warm = mb / median(hf.warm_s);
    const double hf_batch = mb / median(hf.batch_s);
    std::printf("  HF tokenizers (same text, 1 thread, fresh tokenizer per run):\n");
    std::printf("    encode(text)           %8.2f MB/s  (second call %.2f MB/s)\n", hf_mb_s, hf_warm);
    std::printf("    encode_batch(lines)    %8.2f MB/s  (%zu tokens)\n", hf_batch, hf.batch_tokens);
    std::printf("  loom / HF encode: %.2fx cold, %.2fx warm\n", (mb / median(cold_s)) / hf_mb_s,
                (mb / median(warm_s)) / hf_warm);
    if (ids_equal)
      std::printf("  ids: equal (%zu)\n", ids.size());
    else
      std::printf("  ids: DIFFER (loom %zu, HF %zu, first difference at %zu)\n", ids.size(), hf_ids.size(), first);
    peer->terminate();
    summary["peer"] = "hf-tokenizers";
    summary["peer_encode_mb_per_s"] = hf_mb_s;
    summary["peer_encode_second_mb_per_s"] = hf_warm;
    summary["peer_encode_batch_mb_per_s"] = hf_batch;
    summary["encode_ratio"] = (mb / median(cold_s)) / hf_mb_s;
    summary["ids_equal"] = ids_equal;
  }
  std::printf("SUMMARY %s\n", summary.dump().c_str());
  // gpt2 and byte promise decode(encode(x)) == x; a normalizing tokenizer (NFC) need not.
  const bool must_round_trip = spec == "gpt2" || spec == "byte";
  return ids_equal && (round_trip || !must_round_trip) ? 0 : 1;
}

}  // namespace loom::cli
