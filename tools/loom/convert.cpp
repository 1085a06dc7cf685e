// `loom convert --model PATH --out DIR [--dtype f32|bf16]`: a GGUF file or a Hugging Face
// directory written as a loom checkpoint that generate, eval, serve, chat and quantize load with
// --checkpoint DIR. It holds what model/checkpoint_reader.h reads (manifest.json,
// model.safetensors, config.json, trainer_state.json naming the tokenizer) and the tokenizer
// itself; it is not a training checkpoint to resume (no optimizer state). docs/MODELS.md.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/manifest.h"
#include "loom/model/hf_weights.h"
#include "loom/model/model_source.h"
#include "tools/loom/commands.h"
#include "tools/loom/model_card_files.h"

namespace loom::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// --out as an absolute path without a trailing separator; refuses to replace anything but a
// loom checkpoint or an empty directory.
fs::path output_dir(const std::string& out) {
  fs::path d = fs::absolute(out).lexically_normal();
  if (d.filename().empty()) d = d.parent_path();
  std::error_code ec;
  if (!fs::exists(d, ec)) return d;
  const std::string format = io::manifest_format(d.string());
  const bool replaceable = format == io::kTrainingCheckpointFormat || format == io::kQuantizedCheckpointFormat ||
                           (fs::is_directory(d, ec) && fs::is_empty(d, ec));
  if (!replaceable)
    throw UsageError(str_cat("[convert] --out ", out,
                             " exists and is not a loom checkpoint; give a new directory (convert replaces only an "
                             "earlier checkpoint)"));
  return d;
}

}  // namespace

int cmd_convert(const std::vector<std::string>& argv) {
  auto app = new_app("convert",
                     "Writes DIR, a loom checkpoint of a GGUF file (weights dequantized) or a Hugging Face directory "
                     "(model.safetensors or its shards), with the model's tokenizer and chat template inside it; loom "
                     "generate, eval, serve, chat and quantize load it with --checkpoint DIR. The last line is "
                     "SUMMARY {json}.");
  std::string src, out, dtype = "f32";
  app->add_option("--model", src, "a GGUF file or a Hugging Face directory")->type_name("PATH")->required();
  app->add_option("--out", out, "the checkpoint (an earlier checkpoint there is replaced)")
      ->type_name("DIR")
      ->required();
  app->add_option("--dtype", dtype, "the weights as stored (bf16 halves the file; loaded as f32)")
      ->check(one_of({"f32", "bf16"}));
  if (auto rc = parse(*app, argv)) return *rc;
  Stopwatch sw;
  const model::ModelFormat format = model::model_format(src);
  if (format == model::ModelFormat::loom)
    throw UsageError(str_cat(
        "[convert] ", src, " is a loom checkpoint already; load it as it is, or use loom quantize for a smaller copy"));
  const fs::path final_dir = output_dir(out);
  const model::ModelCard card = model::read_model_card(src);
  // Before the weights: a config that has no config.json form (a GGUF's per-frequency RoPE
  // factors) is refused here, naming what to convert instead; write_card_files writes it.
  (void)model::hf_config_json(card.config);
  model::DecoderOptions opt;
  opt.allocate_flat_grads = false;
  model::Decoder m(card.config, opt);
  const std::string how = model::load_model_weights(src, card, m);
  std::fprintf(stderr, "[convert] %s (%s): %s, %.1fM parameters; weights %s\n", card.name.c_str(),
               model::model_format_name(format), card.config.summary().c_str(), double(m.num_params()) / 1e6,
               how.c_str());

  const fs::path tmp = final_dir.string() + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  LOOM_CHECK(!ec, "convert", "cannot create ", tmp.string(), ": ", ec.message());
  std::string tokenizer;
  try {
    model::save_hf_safetensors(m, (tmp / io::kWeightsFile).string(), dtype == "bf16" ? DType::bf16 : DType::f32);
    const CardFiles card_files = write_card_files(src, card, tmp);
    tokenizer = card_files.tokenizer;
    std::vector<std::string> files = {io::kWeightsFile};
    files.insert(files.end(), card_files.files.begin(), card_files.files.end());
    io::ManifestWriter manifest(tmp.string());
    for (const std::string& f : files) manifest.record(f);
    manifest.write(io::kTrainingCheckpointFormat, io::kTrainingCheckpointVersion,
                   {{"step", 0}, {"model", card.name}, {"converted_from", card_files.converted_from}});
    io::fsync_dir(tmp.string());
    fs::remove_all(final_dir, ec);
    fs::rename(tmp, final_dir, ec);
    LOOM_CHECK(!ec, "convert", "cannot rename ", tmp.string(), " to ", final_dir.string(), ": ", ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  std::string why;
  LOOM_CHECK(io::verify_checkpoint(final_dir.string(), &why), "convert", final_dir.string(),
             " failed verification after writing: ", why);
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(final_dir))
    if (e.is_regular_file()) bytes += int64_t(e.file_size());
  std::printf("[convert] %s -> %s: %s weights, checkpoint %.1f MB, tokenizer %s%s, %.1f s\n", src.c_str(),
              final_dir.string().c_str(), dtype.c_str(), double(bytes) / 1e6, tokenizer.c_str(),
              card.chat_template.empty() ? "" : ", chat template kept", sw.seconds());
  const json s = {{"source", src},
                  {"format", model::model_format_name(format)},
                  {"out", final_dir.string()},
                  {"dtype", dtype},
                  {"params", m.num_params()},
                  {"checkpoint_bytes", bytes},
                  {"tokenizer", tokenizer},
                  {"chat_template", !card.chat_template.empty()},
                  {"seconds", sw.seconds()}};
  std::printf("SUMMARY %s\n", s.dump().c_str());
  return 0;
}

}  // namespace loom::cli
