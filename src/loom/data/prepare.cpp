// prepare(): check every input, tokenise them in order into one temporary stream, then cut
// that stream into train.bin and val.bin (the last val_fraction) and write meta.json.
#include "loom/data/prepare.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/data/dataset.h"
#include "loom/data/shard_format.h"
#include "loom/data/tokenizer.h"
#include "loom/data/unicode.h"
#include "loom/io/file.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

std::vector<std::shared_ptr<const io::MappedFile>> open_inputs(const PrepareOptions& opt) {
  LOOM_CHECK(!opt.inputs.empty(), "prepare", "no input files; pass --input FILE (repeatable)");
  std::vector<std::shared_ptr<const io::MappedFile>> files;
  for (const std::string& path : opt.inputs) {
    auto f = io::MappedFile::open(path, "prepare", "check the --input path");
    LOOM_CHECK(f->size() > 0, "prepare", path, " is empty; give a text file with content");
    const double garbage = garbage_fraction(f->data(), f->data() + f->size());
    LOOM_CHECK(garbage <= opt.max_garbage_fraction, "prepare", path, " looks binary, not text: ", std::fixed,
               std::setprecision(1), 100.0 * garbage, "% of its bytes are NUL/control bytes or invalid UTF-8 (limit ",
               100.0 * opt.max_garbage_fraction, "%); give a UTF-8 text file");
    files.push_back(std::move(f));
  }
  return files;
}

void check_out_dir(const PrepareOptions& opt) {
  LOOM_CHECK(!opt.out_dir.empty(), "prepare", "no output folder; pass --out DIR");
  const fs::path dir(opt.out_dir);
  if (!fs::exists(dir)) return;
  LOOM_CHECK(fs::is_directory(dir), "prepare", opt.out_dir, " exists and is not a folder; choose another --out");
  LOOM_CHECK(fs::is_empty(dir) || opt.force, "prepare", "output folder ", opt.out_dir,
             " already exists and is not empty; pass --force to overwrite its shards, or choose another --out");
}

void write_meta(const PrepareOptions& opt, const PrepareResult& r, const ShardHeader& train, const ShardHeader& val,
                std::optional<int32_t> eot) {
  nlohmann::json meta = {
      {"format", "loom token shards"},
      {"format_version", kShardVersion},
      {"tokenizer", r.tokenizer},
      {"vocab_size", r.vocab_size},
      {"eot_id", eot ? nlohmann::json(*eot) : nlohmann::json(nullptr)},
      {"dtype", train.token_bytes == 2 ? "u16" : "u32"},
      {"val_fraction", opt.val_fraction},
      {"train", {{"file", "train.bin"}, {"tokens", train.n_tokens}, {"fnv1a64", train.checksum}}},
      {"val", {{"file", "val.bin"}, {"tokens", val.n_tokens}, {"fnv1a64", val.checksum}}},
      {"unigram_val_nats",
       std::isfinite(r.unigram_val_nats) ? nlohmann::json(r.unigram_val_nats) : nlohmann::json(nullptr)},
  };
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& s : r.sources) sources.push_back({{"path", s.path}, {"bytes", s.bytes}, {"tokens", s.tokens}});
  meta["sources"] = sources;
  const fs::path path = fs::path(opt.out_dir) / "meta.json", tmp = fs::path(opt.out_dir) / "meta.json.tmp";
  {
    std::ofstream f(tmp);
    f << meta.dump(2) << "\n";
    LOOM_CHECK(f.good(), "prepare", "cannot write ", tmp.string());
  }
  fs::rename(tmp, path);
}

// The shard header has 31 bytes for the tokenizer's name: a tokenizer given by path is named
// there by its file or folder name (cut to 31 bytes); meta.json records the whole path.
std::string header_tokenizer_name(const std::string& name) {
  if (name.size() < 32) return name;
  fs::path p(name);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string().substr(0, 31);
}

}  // namespace

double unigram_cross_entropy(std::span<const int64_t> fit_counts, int64_t fit_total,
                             std::span<const int64_t> eval_counts) {
  const double vocab = double(fit_counts.size());
  const double denom = double(fit_total) + 0.5 * vocab;
  double nll = 0;
  int64_t n = 0;
  for (size_t id = 0; id < eval_counts.size(); ++id) {
    if (!eval_counts[id]) continue;
    nll -= double(eval_counts[id]) * std::log((double(fit_counts[id]) + 0.5) / denom);
    n += eval_counts[id];
  }
  return n ? nll / double(n) : std::nan("");
}

PrepareResult prepare(const PrepareOptions& opt) {
  Stopwatch clock;
  LOOM_CHECK(opt.val_fraction >= 0 && opt.val_fraction < 1, "prepare", "--val-fraction must be in [0, 1), got ",
             opt.val_fraction);
  std::unique_ptr<Tokenizer> tok = make_tokenizer(opt.tokenizer, opt.data_dir);
  const auto inputs = open_inputs(opt);
  check_out_dir(opt);
  fs::create_directories(opt.out_dir);

  PrepareResult r;
  r.tokenizer = tok->name();
  r.vocab_size = tok->vocab_size();
  ShardHeader proto;
  proto.token_bytes = token_bytes_for_vocab(r.vocab_size);
  proto.vocab_size = uint32_t(r.vocab_size);
  proto.eot_id = tok->eot_id() ? uint32_t(*tok->eot_id()) : kNoEot;
  proto.tokenizer = header_tokenizer_name(r.tokenizer);

  // Pass 1: the whole token stream into one temporary shard (its length fixes the split).
  const std::string all_path = (fs::path(opt.out_dir) / ".all.tokens").string();
  struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() {
      std::error_code ec;
      fs::remove(path, ec);
    }
  } cleanup{all_path};
  size_t total_bytes = 0, bytes_before = 0;
  for (const auto& f : inputs) total_bytes += f->size();
  {
    proto.split = "all";
    ShardWriter all(all_path, proto);
    for (const auto& f : inputs) {
      PreparedSource src{f->path(), int64_t(f->size()), 0};
      if (auto eot = tok->eot_id()) {  // every document starts with <|endoftext|>, as in GPT-2 training
        const int32_t e = *eot;
        all.append({&e, 1});
        src.tokens = 1;
      }
      tok->encode_stream(f->view(), [&](std::span<const int32_t> ids, size_t done) {
        all.append(ids);
        src.tokens += int64_t(ids.size());
        if (opt.progress) opt.progress(bytes_before + done, total_bytes);
      });
      bytes_before += f->size();
      r.sources.push_back(src);
    }
    all.finish();
  }

  // Pass 2: split, counting unigrams for the baseline on the way.
  TokenDataset all(all_path);
  const int64_t n = all.size();
  int64_t n_val = int64_t(double(n) * opt.val_fraction);
  if (opt.val_fraction > 0 && n_val == 0 && n >= 2) n_val = 1;
  const int64_t n_train = n - n_val;
  std::vector<int64_t> train_counts(size_t(r.vocab_size), 0), val_counts(size_t(r.vocab_size), 0);
  std::vector<int32_t> buf;
  auto copy_range = [&](const char* split, int64_t first, int64_t count, std::vector<int64_t>& counts) {
    ShardHeader h = proto;
    h.split = split;
    ShardWriter w((fs::path(opt.out_dir) / (std::string(split) + ".bin")).string(), h);
    constexpr int64_t kChunk = int64_t(1) << 20;
    for (int64_t at = first; at < first + count; at += kChunk) {
      const int64_t m = std::min(kChunk, first + count - at);
      buf.resize(size_t(m));
      all.read(at, m, buf.data());
      for (int32_t id : buf) ++counts[size_t(id)];
      w.append(buf);
    }
    return w.finish();
  };
  const ShardHeader train_h = copy_range("train", 0, n_train, train_counts);
  const ShardHeader val_h = copy_range("val", n_train, n_val, val_counts);

  r.train_tokens = n_train;
  r.val_tokens = n_val;
  r.unigram_val_nats = unigram_cross_entropy(train_counts, n_train, val_counts);
  write_meta(opt, r, train_h, val_h, tok->eot_id());
  r.seconds = clock.seconds();
  return r;
}

}  // namespace loom::data
