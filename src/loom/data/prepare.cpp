// prepare(): check every input, tokenise them in order into one temporary stream (conversations
// with their loss mask), then cut that stream into train.bin and val.bin (the last val_fraction
// of the tokens, or of the conversations) and write meta.json.
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

std::vector<std::shared_ptr<const io::MappedFile>> open_inputs(const std::vector<std::string>& paths,
                                                               const char* option, double max_garbage_fraction) {
  LOOM_CHECK(!paths.empty(), "prepare", "no input files; pass --input FILE (repeatable)");
  std::vector<std::shared_ptr<const io::MappedFile>> files;
  for (const std::string& path : paths) {
    auto f = io::MappedFile::open(path, "prepare", str_cat("check the ", option, " path"));
    LOOM_CHECK(f->size() > 0, "prepare", path, " is empty; give a text file with content");
    const double garbage = garbage_fraction(f->data(), f->data() + f->size());
    LOOM_CHECK(garbage <= max_garbage_fraction, "prepare", path, " looks binary, not text: ", std::fixed,
               std::setprecision(1), 100.0 * garbage, "% of its bytes are NUL/control bytes or invalid UTF-8 (limit ",
               100.0 * max_garbage_fraction, "%); give a UTF-8 text file");
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
      {"loss_mask", train.has_mask()},
      {"val_fraction", opt.val_fraction},
      {"train", {{"file", "train.bin"}, {"tokens", train.n_tokens}, {"fnv1a64", train.checksum}}},
      {"val", {{"file", "val.bin"}, {"tokens", val.n_tokens}, {"fnv1a64", val.checksum}}},
      {"unigram_val_nats",
       std::isfinite(r.unigram_val_nats) ? nlohmann::json(r.unigram_val_nats) : nlohmann::json(nullptr)},
  };
  if (r.chat) {
    meta["chat_template"] = opt.chat_template->name;
    meta["train"]["conversations"] = r.train_conversations;
    meta["train"]["trained_tokens"] = r.train_trained_tokens;
    meta["val"]["conversations"] = r.val_conversations;
    meta["val"]["trained_tokens"] = r.val_trained_tokens;
  }
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& s : r.sources) {
    nlohmann::json j = {{"path", s.path}, {"bytes", s.bytes}, {"tokens", s.tokens}};
    if (r.chat) {
      j["conversations"] = s.conversations;
      j["trained_tokens"] = s.trained_tokens;
    }
    sources.push_back(std::move(j));
  }
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

using Inputs = std::vector<std::shared_ptr<const io::MappedFile>>;
using Progress = std::function<void(size_t done)>;  // input bytes done, over all inputs

// Pass 1 for text: every document, preceded by the end-of-text id where there is one.
void write_documents(const Tokenizer& tok, const Inputs& inputs, ShardWriter& all, PrepareResult& r,
                     const Progress& progress) {
  size_t bytes_before = 0;
  for (const auto& f : inputs) {
    PreparedSource src{f->path(), int64_t(f->size()), 0};
    if (auto eot = tok.eot_id()) {  // every document starts with <|endoftext|>, as in GPT-2 training
      const int32_t e = *eot;
      all.append({&e, 1});
      src.tokens = 1;
    }
    tok.encode_stream(f->view(), [&](std::span<const int32_t> ids, size_t done) {
      all.append(ids);
      src.tokens += int64_t(ids.size());
      progress(bytes_before + done);
    });
    bytes_before += f->size();
    r.sources.push_back(src);
  }
}

// Pass 1 for chat: each non-blank line of each file is a conversation, its tokens and mask.
void write_conversations(const ConversationTokenizer& conv, const Inputs& inputs, ShardWriter& all, PrepareResult& r,
                         const Progress& progress) {
  size_t bytes_before = 0;
  for (const auto& f : inputs) {
    PreparedSource src{f->path(), int64_t(f->size()), 0};
    const std::string_view text = f->view();
    int64_t line_no = 0;
    for (size_t at = 0; at < text.size();) {
      const size_t nl = std::min(text.find('\n', at), text.size());
      const std::string_view line = text.substr(at, nl - at);
      ++line_no;
      at = nl + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string where = str_cat(f->path(), ":", line_no);
      const TokenizedConversation c = conv.tokenize(parse_conversation(line, where), where);
      all.append(c.ids, c.mask);
      src.tokens += int64_t(c.ids.size());
      src.trained_tokens += c.trained;
      ++src.conversations;
      progress(bytes_before + std::min(at, text.size()));
    }
    LOOM_CHECK(src.conversations > 0, "prepare", f->path(), " holds no conversations; give one JSON object per line");
    bytes_before += f->size();
    r.sources.push_back(src);
  }
}

// Removes the output folder prepare() created when it fails before the end (its shards are
// written through temporary names, so the folder is empty then).
struct OutDirGuard {
  fs::path dir;
  bool created = false, done = false;
  ~OutDirGuard() {
    std::error_code ec;
    if (created && !done) fs::remove(dir, ec);
  }
};

struct RemoveOnExit {
  std::string path;
  ~RemoveOnExit() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

// Where val.bin starts: the last val_fraction of the tokens, or of the conversations (at least
// one of each when there are two or more and val_fraction > 0).
int64_t split_point(const TokenDataset& all, double val_fraction) {
  const bool chat = all.has_mask();
  const int64_t n = chat ? int64_t(all.conversation_starts().size()) : all.size();
  int64_t n_val = int64_t(double(n) * val_fraction);
  if (val_fraction > 0 && n_val == 0 && n >= 2) n_val = 1;
  if (!chat) return n - n_val;
  return n_val == 0 ? all.size() : all.conversation_starts()[size_t(n - n_val)];
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
  const bool chat = !opt.chat_inputs.empty();
  LOOM_CHECK(!chat || opt.inputs.empty(), "prepare",
             "--input (text) and --chat (conversations) are given together; prepare them into separate folders");
  LOOM_CHECK(!chat || opt.chat_template, "prepare",
             "--chat needs a chat template: a --tokenizer that carries one "
             "(a .gguf model or a Hugging Face folder) or --chat-template FILE");
  std::unique_ptr<Tokenizer> tok = make_tokenizer(opt.tokenizer, opt.data_dir);
  std::optional<ConversationTokenizer> conv;
  if (chat) conv.emplace(*tok, *opt.chat_template);  // a template that does not parse fails here
  const auto inputs = chat ? open_inputs(opt.chat_inputs, "--chat", opt.max_garbage_fraction)
                           : open_inputs(opt.inputs, "--input", opt.max_garbage_fraction);
  check_out_dir(opt);
  OutDirGuard out_guard{opt.out_dir, !fs::exists(opt.out_dir)};
  fs::create_directories(opt.out_dir);

  PrepareResult r;
  r.tokenizer = tok->name();
  r.vocab_size = tok->vocab_size();
  r.chat = chat;
  ShardHeader proto;
  proto.token_bytes = token_bytes_for_vocab(r.vocab_size);
  proto.vocab_size = uint32_t(r.vocab_size);
  proto.eot_id = tok->eot_id() ? uint32_t(*tok->eot_id()) : kNoEot;
  proto.flags = chat ? kShardHasMask : 0;
  proto.tokenizer = header_tokenizer_name(r.tokenizer);

  // Pass 1: the whole token stream into one temporary shard (its length fixes the split).
  const std::string all_path = (fs::path(opt.out_dir) / ".all.tokens").string();
  RemoveOnExit cleanup{all_path};
  size_t total_bytes = 0;
  for (const auto& f : inputs) total_bytes += f->size();
  const Progress progress = [&](size_t done) {
    if (opt.progress) opt.progress(done, total_bytes);
  };
  {
    proto.split = "all";
    ShardWriter all(all_path, proto);
    if (chat) {
      write_conversations(*conv, inputs, all, r, progress);
    } else {
      write_documents(*tok, inputs, all, r, progress);
    }
    all.finish();
  }

  // Pass 2: split, counting unigrams (of trained tokens, for chat) for the baseline on the way.
  TokenDataset all(all_path);
  const int64_t n = all.size(), n_train = split_point(all, opt.val_fraction), n_val = n - n_train;
  std::vector<int64_t> train_counts(size_t(r.vocab_size), 0), val_counts(size_t(r.vocab_size), 0);
  std::vector<int32_t> buf;
  std::vector<uint8_t> mask;
  auto copy_range = [&](const char* split, int64_t first, int64_t count, std::vector<int64_t>& counts,
                        int64_t& trained) {
    ShardHeader h = proto;
    h.split = split;
    ShardWriter w((fs::path(opt.out_dir) / (std::string(split) + ".bin")).string(), h);
    constexpr int64_t kChunk = int64_t(1) << 20;
    for (int64_t at = first; at < first + count; at += kChunk) {
      const int64_t m = std::min(kChunk, first + count - at);
      buf.resize(size_t(m));
      mask.resize(size_t(m));
      all.read(at, m, buf.data());
      all.read_mask(at, m, mask.data());
      for (size_t i = 0; i < buf.size(); ++i)
        if (mask[i] & kMaskTrained) {
          ++counts[size_t(buf[i])];
          ++trained;
        }
      if (chat) {
        w.append(buf, mask);
      } else {
        w.append(buf);
      }
    }
    return w.finish();
  };
  const ShardHeader train_h = copy_range("train", 0, n_train, train_counts, r.train_trained_tokens);
  const ShardHeader val_h = copy_range("val", n_train, n_val, val_counts, r.val_trained_tokens);

  r.train_tokens = n_train;
  r.val_tokens = n_val;
  if (chat) {
    const auto& starts = all.conversation_starts();
    r.train_conversations = std::lower_bound(starts.begin(), starts.end(), n_train) - starts.begin();
    r.val_conversations = int64_t(starts.size()) - r.train_conversations;
  }
  r.unigram_val_nats = unigram_cross_entropy(train_counts, r.train_trained_tokens, val_counts);
  write_meta(opt, r, train_h, val_h, tok->eot_id());
  out_guard.done = true;
  r.seconds = clock.seconds();
  return r;
}

}  // namespace loom::data
