#include "loom/train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/io/checksum.h"
#include "loom/io/file.h"
#include "loom/io/safetensors.h"
#include "loom/model/hf_weights.h"
#include "loom/train/train_config.h"

namespace loom::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", (long long)step);
  return buf;
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = checkpoint_step_of(e.path().string());
    if (s >= 0 && e.is_directory()) out.push_back({s, e.path()});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

int64_t checkpoint_step_of(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  if (name.rfind("step_", 0) != 0 || name.size() <= 5) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

std::string save_checkpoint(const std::string& dir, int64_t step, const model::Decoder& model,
                            const optim::AdamW& adam, const std::string& config_yaml,
                            int64_t keep_last) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_CHECK(!ec, "checkpoint", "cannot create ", dir, ": ", ec.message());
  const fs::path final_dir = fs::path(dir) / step_name(step);
  const fs::path tmp = fs::path(dir) / str_cat(".tmp.", step_name(step), ".", getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  LOOM_CHECK(!ec, "checkpoint", "cannot create ", tmp.string(), ": ", ec.message());

  json files = json::object();
  auto record = [&](const std::string& name) {
    const fs::path p = tmp / name;
    files[name] = {{"bytes", fs::file_size(p)}, {"crc32c", io::crc32c_hex(io::crc32c_file(p.string()))}};
  };
  model::save_hf_safetensors(model, (tmp / "model.safetensors").string());
  record("model.safetensors");
  io::write_file_atomic((tmp / "config.json").string(), model::hf_config_json(model.config()));
  record("config.json");
  {
    io::SafetensorsWriter w;
    w.add("exp_avg", adam.exp_avg());
    w.add("exp_avg_sq", adam.exp_avg_sq());
    w.set_metadata("step", std::to_string(adam.step_count()));
    w.set_metadata("begin", std::to_string(adam.begin()));
    w.set_metadata("end", std::to_string(adam.end()));
    w.write((tmp / "optimizer.safetensors").string());
    record("optimizer.safetensors");
  }
  json state = {{"step", step}, {"optimizer_steps", adam.step_count()},
                // Batches are a pure function of (data.seed, step): the step is the position.
                {"data_position", {{"step", step}}}};
  io::write_file_atomic((tmp / "trainer_state.json").string(), state.dump(2));
  record("trainer_state.json");
  io::write_file_atomic((tmp / "config.yaml").string(), config_yaml);
  record("config.yaml");
  json manifest = {{"format", "loom-checkpoint"}, {"version", kFormatVersion}, {"step", step},
                   {"model", model.config().name}, {"files", files}};
  io::write_file_atomic((tmp / "manifest.json").string(), manifest.dump(2));
  io::fsync_dir(tmp.string());

  fs::remove_all(final_dir, ec);  // an older save of the same step (e.g. after a crash)
  fs::rename(tmp, final_dir, ec);
  LOOM_CHECK(!ec, "checkpoint", "cannot rename ", tmp.string(), " to ", final_dir.string(), ": ",
             ec.message());
  io::fsync_dir(dir);
  io::write_file_atomic((fs::path(dir) / "latest").string(), step_name(step) + "\n");

  auto all = list_checkpoints(dir);
  for (size_t i = size_t(std::max<int64_t>(keep_last, 1)); i < all.size(); ++i)
    fs::remove_all(all[i].second, ec);
  return final_dir.string();
}

bool verify_checkpoint(const std::string& path, std::string* why) {
  auto fail_with = [&](const std::string& m) {
    if (why) *why = m;
    return false;
  };
  json manifest;
  try {
    manifest = json::parse(io::read_file((fs::path(path) / "manifest.json").string()));
  } catch (const std::exception& e) {
    return fail_with(str_cat("manifest.json unreadable: ", e.what()));
  }
  if (manifest.value("format", "") != "loom-checkpoint")
    return fail_with("manifest.json is not a loom checkpoint manifest");
  if (manifest.value("version", 0) != kFormatVersion)
    return fail_with(str_cat("manifest version ", manifest.value("version", 0), ", expected ", kFormatVersion));
  if (!manifest.contains("files") || !manifest["files"].is_object())
    return fail_with("manifest.json lists no files");
  for (auto& [name, info] : manifest["files"].items()) {
    const fs::path p = fs::path(path) / name;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) return fail_with(str_cat(name, " is missing"));
    if (size != info.value("bytes", uint64_t(0)))
      return fail_with(str_cat(name, " has ", size, " bytes, manifest says ", info.value("bytes", uint64_t(0)),
                               " (truncated?)"));
    const std::string crc = io::crc32c_hex(io::crc32c_file(p.string()));
    if (crc != info.value("crc32c", ""))
      return fail_with(str_cat(name, " checksum ", crc, " differs from the manifest's ",
                               info.value("crc32c", ""), " (corrupted)"));
  }
  return true;
}

std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log) {
  for (const auto& [step, p] : list_checkpoints(dir)) {
    std::string why;
    if (verify_checkpoint(p.string(), &why)) return p.string();
    if (log) std::fprintf(log, "[resume] skipping %s: %s\n", p.string().c_str(), why.c_str());
  }
  return std::nullopt;
}

CheckpointMeta load_checkpoint(const std::string& path, model::Decoder& model, optim::AdamW* adam) {
  std::string why;
  LOOM_CHECK(verify_checkpoint(path, &why), "checkpoint", path, " failed verification: ", why);
  model::load_hf_safetensors(model, (fs::path(path) / "model.safetensors").string());
  const json state = json::parse(io::read_file((fs::path(path) / "trainer_state.json").string()));
  CheckpointMeta meta;
  meta.step = state.at("step").get<int64_t>();
  meta.path = path;
  if (adam) {
    auto f = io::SafetensorsFile::open((fs::path(path) / "optimizer.safetensors").string());
    Tensor m = f.get("exp_avg"), v = f.get("exp_avg_sq");
    LOOM_CHECK(m.numel() == adam->exp_avg().numel(), "checkpoint", path, ": optimizer state has ",
               m.numel(), " elements but this run's optimizer has ", adam->exp_avg().numel(),
               " (different model or layout?)");
    adam->exp_avg().copy_from(m);
    adam->exp_avg_sq().copy_from(v);
    adam->set_step_count(state.at("optimizer_steps").get<int64_t>());
  }
  return meta;
}

model::ModelConfig checkpoint_model_config(const std::string& path) {
  const std::string yaml = io::read_file((fs::path(path) / "config.yaml").string());
  // The resolved training config carries the exact model section (preset and overrides).
  return parse_train_config(yaml, {}, (fs::path(path) / "config.yaml").string()).model;
}

}  // namespace loom::train
