#include "loom/train/checkpoint_dir.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "loom/comm/group.h"
#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/train/checkpoint.h"

namespace loom::train {

namespace fs = std::filesystem;

std::string new_run_id(const comm::Group& g) {
  Tensor bits = Tensor::zeros({1}, DType::i64, MemCategory::comm);
  if (g.rank() == 0) {
    std::random_device rd;
    bits.data<int64_t>()[0] = int64_t((uint64_t(rd()) << 32) ^ uint64_t(rd()));
  }
  if (g.size() > 1) g.broadcast(bits, 0);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)bits.data<int64_t>()[0]);
  return buf;
}

std::string checkpoint_run_id(const std::string& path) {
  try {
    const auto state = nlohmann::json::parse(io::read_file((fs::path(path) / "trainer_state.json").string()));
    return state.value("run_id", "");
  } catch (const std::exception&) {
    return "";
  }
}

std::vector<std::string> prune_checkpoints(const std::string& dir, const std::string& run_id, int64_t saved_step,
                                           int64_t keep_last, int64_t protect_upto) {
  std::vector<std::string> removed;
  if (run_id.empty()) return removed;
  int64_t kept = 0;
  bool protected_one = false;
  for (const CheckpointEntry& e : list_checkpoints(dir)) {  // highest step first
    if (e.step > saved_step || checkpoint_run_id(e.path) != run_id) continue;
    const bool fallback = !protected_one && protect_upto >= 0 && e.step <= protect_upto;
    protected_one = protected_one || fallback;
    if (++kept <= std::max<int64_t>(keep_last, 1) || e.step == saved_step || fallback) continue;
    std::error_code ec;
    fs::remove_all(e.path, ec);
    if (!ec) removed.push_back(e.path);
  }
  return removed;
}

std::vector<std::string> claim_checkpoint_dir(const std::string& dir, bool overwrite) {
  const std::vector<CheckpointEntry> held = list_checkpoints(dir);
  std::vector<std::string> removed;
  if (held.empty()) return removed;
  if (!overwrite) {
    const std::string run = checkpoint_run_id(held.front().path);
    fail("checkpoint", "checkpoint.dir=", dir, " already holds ", held.size(), " checkpoint",
         held.size() == 1 ? "" : "s", " (newest: ", fs::path(held.front().path).filename().string(),
         run.empty() ? std::string() : str_cat(" of run ", run),
         ") and this run starts from step 0; a new run there would mix its checkpoints with them. "
         "Continue that run with --resume auto, give this run another checkpoint.dir, or pass "
         "--overwrite-checkpoints to delete them");
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {  // checkpoints, interrupted saves, latest
    const std::string name = e.path().filename().string();
    if (checkpoint_step_of(name) >= 0 || name.starts_with(".tmp.step_") || name == "latest")
      removed.push_back(e.path().string());
  }
  for (const std::string& p : removed) {
    fs::remove_all(p, ec);
    LOOM_CHECK(!ec, "checkpoint", "--overwrite-checkpoints: cannot remove ", p, ": ", ec.message());
  }
  return removed;
}

}  // namespace loom::train
