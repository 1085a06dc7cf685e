// `loom export --checkpoint DIR --format hf|gguf --out PATH`: a loom checkpoint written for
// other programs, as a Hugging Face directory (config.json, model.safetensors, the tokenizer and
// chat files) or as one GGUF file that llama.cpp runs. The weights are model/export_hf.h's and
// export_gguf.h's, the tokenizer data/tokenizer_export.h's; this file reads the checkpoint,
// checks the options and the output path, and publishes the result whole or not at all.
// docs/FINETUNING.md, "Give it back".
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/data/tokenizer_export.h"
#include "loom/infer/quant_checkpoint.h"
#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/model/checkpoint_reader.h"
#include "loom/model/export_gguf.h"
#include "loom/model/export_hf.h"
#include "loom/model/lora_merge.h"
#include "loom/model/model_source.h"
#include "tools/loom/commands.h"
#include "tools/loom/inference_model.h"

namespace loom::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct ExportOptions {
  std::string checkpoint, format, out, dtype, type;
  bool force = false, merge_lora = false;
};

// Refusals of the options themselves, before anything is read.
void check_options(const ExportOptions& o) {
  if (o.format != "hf" && o.format != "gguf")
    throw UsageError(str_cat("[export] --format ", o.format, " is not supported; use hf or gguf"));
  if (o.format == "hf") {
    if (!o.type.empty()) throw UsageError("[export] --type applies to --format gguf; for --format hf give --dtype");
    if (!o.dtype.empty() && o.dtype != "f32" && o.dtype != "bf16" && o.dtype != "f16")
      throw UsageError(str_cat("[export] --dtype ", o.dtype, " is not supported; use f32, bf16 or f16"));
  } else {
    if (!o.dtype.empty()) throw UsageError("[export] --dtype applies to --format hf; for --format gguf give --type");
    if (!o.type.empty() && !model::gguf_export_type(o.type))
      throw UsageError(str_cat("[export] --type ", o.type, " is not supported; use ", model::gguf_export_type_names()));
  }
}

// --out as an absolute path; an existing one is replaced only with --force, and then only when it
// is what this format writes (a directory with config.json, or empty; a file), so a mistyped
// --out never deletes a directory of other things.
fs::path output_path(const ExportOptions& o) {
  fs::path p = fs::absolute(o.out).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::error_code ec;
  if (!fs::exists(p, ec)) return p;
  if (!o.force)
    throw UsageError(str_cat("[export] --out ", o.out, " exists; give a new path, or --force to replace it"));
  const bool dir = fs::is_directory(p, ec);
  if (o.format == "gguf" && dir)
    throw UsageError(str_cat("[export] --out ", o.out, " is a directory; --format gguf writes one file"));
  if (o.format == "hf" && (!dir || !(fs::is_empty(p, ec) || fs::exists(p / "config.json"))))
    throw UsageError(str_cat("[export] --out ", o.out,
                             " is not a Hugging Face directory (no config.json); --force replaces only an earlier "
                             "export or an empty directory"));
  return p;
}

// The checkpoint directory: a loom checkpoint or the newest valid one of a run directory.
std::string checkpoint_dir(const std::string& path) {
  const model::ModelFormat f = model::model_format(path);
  if (f != model::ModelFormat::loom)
    throw UsageError(str_cat("[export] ", path, " is a ", model::model_format_name(f),
                             " model, not a loom checkpoint; loom convert --model ", path,
                             " --out DIR makes one, or use it as it is"));
  if (infer::is_quantized_checkpoint(path))
    throw UsageError(str_cat("[export] ", path,
                             " is a quantized checkpoint (loom quantize); export the f32 checkpoint it was made from"));
  const std::string dir = model::resolve_checkpoint(path, stderr);
  LOOM_CHECK(fs::exists(fs::path(dir) / io::kWeightsFile) && fs::exists(fs::path(dir) / io::kHfConfigFile), "export",
             dir, " holds no model (", io::kWeightsFile, " and ", io::kHfConfigFile,
             "); give a checkpoint that loom train or loom convert wrote");
  return dir;
}

// What the model is called: the manifest's name (a converted model's), the preset it was
// trained from, else the run's directory.
std::string model_name(const std::string& dir, const model::ModelConfig& cfg) {
  try {
    const json m = json::parse(io::read_file((fs::path(dir) / "manifest.json").string()));
    if (m.contains("model") && m["model"].is_string() && !m["model"].get<std::string>().empty())
      return m["model"].get<std::string>();
  } catch (const std::exception&) {
  }
  if (cfg.name != "custom") return cfg.name;
  const fs::path d = fs::absolute(dir).lexically_normal();
  return io::checkpoint_step_of(d.string()) >= 0 ? d.parent_path().filename().string() : d.filename().string();
}

data::ChatCard chat_card(const std::string& dir) {
  model::ModelCard c;
  model::read_chat_files(dir, c);
  return {c.chat_template, c.bos_token, c.eos_token, c.end_ids};
}

DType dtype_of(const std::string& s) { return s == "bf16" ? DType::bf16 : s == "f16" ? DType::f16 : DType::f32; }

// The Hugging Face directory, written beside `final_dir` and renamed onto it when complete.
data::ExportedTokenizer write_hf(const model::Decoder& m, const std::string& tokenizer, const data::ChatCard& card,
                                 const ExportOptions& o, const fs::path& final_dir, std::vector<std::string>& notes) {
  data::ExportedTokenizer tok = data::hf_tokenizer_files(tokenizer, card, m.config().vocab_size, m.config().n_ctx);
  const fs::path tmp = final_dir.string() + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  LOOM_CHECK(!ec, "export", "cannot create ", tmp.string(), ": ", ec.message());
  try {
    const std::vector<std::string> model_notes =
        model::write_hf_model(m, tmp.string(), {dtype_of(o.dtype), tok.bos_id, tok.eos_id});
    notes.insert(notes.end(), model_notes.begin(), model_notes.end());
    for (const auto& f : tok.files) io::write_file_atomic((tmp / f.name).string(), f.bytes);
    io::fsync_dir(tmp.string());
    fs::remove_all(final_dir, ec);
    fs::rename(tmp, final_dir, ec);
    LOOM_CHECK(!ec, "export", "cannot rename ", tmp.string(), " to ", final_dir.string(), ": ", ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return tok;
}

int64_t bytes_under(const fs::path& p) {
  if (fs::is_regular_file(p)) return int64_t(fs::file_size(p));
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(p))
    if (e.is_regular_file()) n += int64_t(e.file_size());
  return n;
}

}  // namespace

int cmd_export(const std::vector<std::string>& argv) {
  auto app = new_app("export",
                     "Writes a loom checkpoint for other programs: --format hf, a Hugging Face directory "
                     "(config.json, model.safetensors, tokenizer.json, tokenizer_config.json with the chat template, "
                     "generation_config.json) that transformers loads; --format gguf, one GGUF file that llama.cpp "
                     "runs, with the tokenizer and chat template inside. The last line is SUMMARY {json}.");
  ExportOptions o;
  app->add_option("--checkpoint", o.checkpoint, "a checkpoint, or a run directory (its newest valid checkpoint)")
      ->type_name("DIR")
      ->required();
  app->add_option("--format", o.format, "hf or gguf")->required();
  app->add_option("--out", o.out, "the directory (hf) or file (gguf) to write")->type_name("PATH")->required();
  app->add_option("--dtype", o.dtype, "hf: the weights' dtype, f32 (default), bf16 or f16");
  app->add_option("--type", o.type,
                  "gguf: the matrices' type, f32 (default), f16, bf16, q8_0, q5_1, q5_0, q4_1 or q4_0; norms stay "
                  "F32 and a quantized file's head Q8_0");
  app->add_flag("--force", o.force, "replace --out if it exists (an earlier export)");
  app->add_flag("--merge-lora", o.merge_lora,
                "the checkpoint holds LoRA adapters (model.lora): fold them into the model they were trained on "
                "(the path its trainer_state.json records, checked by SHA-256) and write the merged model");
  if (auto rc = parse(*app, argv)) return *rc;
  check_options(o);
  Stopwatch sw;
  const fs::path out = output_path(o);
  const std::string dir = checkpoint_dir(o.checkpoint);
  const bool lora = model::is_lora_checkpoint(dir);
  if (lora && !o.merge_lora)
    throw UsageError(str_cat("[export] ", dir,
                             " holds LoRA adapters, not a whole model; add --merge-lora to fold them "
                             "into the model they were trained on"));
  if (!lora && o.merge_lora)
    throw UsageError(str_cat("[export] --merge-lora: ", dir, " holds no LoRA adapters (no ", io::kAdapterConfigFile,
                             "); drop --merge-lora to export it as it is"));
  const model::ModelConfig cfg = model::checkpoint_model_config(dir);
  const std::string name = model_name(dir, cfg);
  const std::string tokenizer = model::checkpoint_tokenizer(dir);
  const data::ChatCard card = chat_card(dir);
  // A LoRA checkpoint: its base with the adapters merged, as the inference commands load it.
  std::optional<InferenceModel> merged;
  if (lora) merged = load_inference_model(dir, std::nullopt, stderr, /*resolved=*/true);
  model::DecoderOptions dopt;
  dopt.allocate_flat_grads = false;
  std::unique_ptr<model::Decoder> own;
  if (!lora) {
    own = std::make_unique<model::Decoder>(cfg, dopt);
    model::read_checkpoint_weights(dir, *own, /*verified=*/true);  // by resolve_checkpoint
  }
  const model::Decoder& m = lora ? *merged->model : *own;
  std::fprintf(stderr, "[export] %s (%s): %s, %.1fM parameters\n", dir.c_str(), name.c_str(), cfg.summary().c_str(),
               double(m.num_params()) / 1e6);

  std::vector<std::string> notes;
  data::ExportedTokenizer tok;
  const std::string stored = o.format == "hf" ? (o.dtype.empty() ? "f32" : o.dtype) : (o.type.empty() ? "f32" : o.type);
  std::string tensors = stored + " weights";
  if (o.format == "hf") {
    tok = write_hf(m, tokenizer, card, o, out, notes);
  } else {
    io::GgufWriter w;
    const model::GgufExportReport r = model::add_gguf_model(m, name, *model::gguf_export_type(stored), w);
    tok = data::set_gguf_tokenizer(tokenizer, card, cfg.vocab_size, w);
    std::error_code ec;
    fs::create_directories(out.parent_path(), ec);
    w.write(out.string());
    notes.insert(notes.end(), r.notes.begin(), r.notes.end());
    tensors = str_cat(r.arch, " tensors ", r.describe());
  }
  notes.insert(notes.end(), tok.notes.begin(), tok.notes.end());
  for (const std::string& n : notes) std::fprintf(stderr, "[export] note: %s\n", n.c_str());
  const int64_t bytes = bytes_under(out);
  std::printf("[export] %s -> %s: %s, %.1f MB; tokenizer %s%s; %.1f s\n", dir.c_str(), out.string().c_str(),
              tensors.c_str(), double(bytes) / 1e6, tok.how.c_str(),
              card.chat_template.empty() ? "" : ", chat template", sw.seconds());
  const json s = {{"checkpoint", dir},        {"format", o.format},
                  {"out", out.string()},      {"stored", stored},
                  {"params", m.num_params()}, {"bytes", bytes},
                  {"tokenizer", tok.how},     {"chat_template", !card.chat_template.empty()},
                  {"notes", notes.size()},    {"seconds", sw.seconds()}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli
