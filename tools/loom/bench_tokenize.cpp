// `loom bench tokenize`: encode and decode throughput (MB/s of text, one thread) on a text
// file, Tiny Shakespeare by default; checks the round trip and ends with a SUMMARY line.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/data/tokenizer.h"
#include "tools/loom/commands.h"

namespace loom::cli {

int bench_tokenize(const std::vector<std::string>& argv) {
  auto app = bench_app("tokenize");
  std::string name = "gpt2", path = data::default_data_dir() + "/tinyshakespeare/input.txt", data_dir;
  int64_t repeats = 3;
  app->add_option("--tokenizer", name, "the tokenizer")->check(one_of({"gpt2", "byte"}));
  app->add_option("--input", path, "the text to encode")->type_name("FILE");
  app->add_option("--repeats", repeats, "runs, the best counts")->check(positive());
  app->add_option("--data-dir", data_dir, "folder holding gpt2/encoder.json and gpt2/vocab.bpe")->type_name("DIR");
  if (auto rc = parse(*app, argv)) return *rc;
  std::ifstream f(path, std::ios::binary);
  LOOM_CHECK(f.good(), "bench tokenize", "cannot read ", path, "; pass --input FILE");
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const double mb = double(text.size()) / 1e6;

  // Cold: a fresh tokenizer (empty word cache) per repeat, as `loom prepare` sees it.
  double load_s = 0, cold_s = 1e30, warm_s = 1e30, decode_s = 1e30;
  std::vector<int32_t> ids;
  std::string back;
  for (int64_t r = 0; r < repeats; ++r) {
    Stopwatch load;
    auto tok = data::make_tokenizer(name, data_dir);
    load_s = load.seconds();
    Stopwatch cold;
    ids = tok->encode(text);
    cold_s = std::min(cold_s, cold.seconds());
    Stopwatch warm;
    ids = tok->encode(text);
    warm_s = std::min(warm_s, warm.seconds());
    Stopwatch dec;
    back = tok->decode(ids);
    decode_s = std::min(decode_s, dec.seconds());
  }
  const bool round_trip = back == text;
  std::printf("bench tokenize: %s on %s (%.2f MB -> %zu tokens, %.2f bytes/token), best of %lld, 1 thread\n",
              name.c_str(), path.c_str(), mb, ids.size(), double(text.size()) / double(std::max<size_t>(1, ids.size())),
              (long long)repeats);
  std::printf("  load     %8.1f ms\n", load_s * 1e3);
  std::printf("  encode   %8.2f MB/s  (cold word cache; %.2f MB/s warm)\n", mb / cold_s, mb / warm_s);
  std::printf("  decode   %8.2f MB/s\n", mb / decode_s);
  std::printf("  round trip: %s\n", round_trip ? "exact" : "MISMATCH");
  nlohmann::json summary = {{"tokenizer", name},
                            {"input_bytes", text.size()},
                            {"tokens", ids.size()},
                            {"encode_mb_per_s", mb / cold_s},
                            {"encode_warm_mb_per_s", mb / warm_s},
                            {"decode_mb_per_s", mb / decode_s},
                            {"load_ms", load_s * 1e3},
                            {"round_trip", round_trip}};
  std::printf("SUMMARY %s\n", summary.dump().c_str());
  return round_trip ? 0 : 1;
}

}  // namespace loom::cli
