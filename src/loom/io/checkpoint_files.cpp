// A training checkpoint's file names, its verification against manifest.json, and the search
// of a run directory for its newest valid checkpoint (checkpoint_files.h).
#include "loom/io/checkpoint_files.h"

#include <algorithm>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/io/manifest.h"

namespace loom::io {

namespace fs = std::filesystem;

namespace {
std::string rank_str(int r) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%05d", r);
  return buf;
}
}  // namespace

std::string optimizer_rank_file(int rank) { return str_cat("optimizer.rank", rank_str(rank), ".safetensors"); }
std::string onebit_rank_file(int rank) { return str_cat("onebit.rank", rank_str(rank), ".safetensors"); }

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%06lld", (long long)step);
  return buf;
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / checkpoint_dir_name(step)).string();
}

int64_t checkpoint_step_of(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  if (name.rfind("step_", 0) != 0 || name.size() <= 5) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = checkpoint_step_of(e.path().string());
    if (s >= 0 && e.is_directory()) out.push_back({s, e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

std::vector<CheckpointEntry> resume_candidates(const std::string& dir) {
  std::vector<CheckpointEntry> all = list_checkpoints(dir);
  std::string latest;
  try {
    latest = read_file((fs::path(dir) / "latest").string());
  } catch (const std::exception&) {
    return all;  // no pointer (or an unreadable one): highest step first
  }
  while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  auto it = std::find_if(all.begin(), all.end(),
                         [&](const CheckpointEntry& e) { return fs::path(e.path).filename() == latest; });
  if (it != all.end()) std::rotate(all.begin(), it, it + 1);
  return all;
}

static bool in_scope(const std::string& file, const VerifyScope& scope) {
  if (scope.all) return true;
  if (file.starts_with("optimizer.rank") || file.starts_with("onebit.rank")) {
    for (int r : scope.ranks)
      if (file == optimizer_rank_file(r) || file == onebit_rank_file(r)) return true;
    return false;
  }
  if (file.starts_with("optimizer.")) return scope.optimizer;
  return true;
}

bool verify_checkpoint(const std::string& path, std::string* why, const VerifyScope& scope) {
  return verify_manifest(
      path, kTrainingCheckpointFormat, kTrainingCheckpointVersion, why,
      [&](const std::string& name) { return in_scope(name, scope); }, kOldestTrainingCheckpointVersion);
}

std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, FILE* log,
                                                        const std::function<VerifyScope(const std::string&)>& scope_of,
                                                        int64_t max_step, const CandidateAgreement* agree) {
  auto candidates = resume_candidates(dir);
  if (max_step >= 0) std::erase_if(candidates, [&](const CheckpointEntry& e) { return e.step > max_step; });
  for (size_t i = 0;; ++i) {
    const int64_t step = i < candidates.size() ? candidates[i].step : -1;
    if (agree) agree->same_candidate(step);
    if (step < 0) return std::nullopt;
    const std::string p = candidates[i].path;
    std::string why;
    bool ok = verify_checkpoint(p, &why, scope_of(p));
    if (agree) ok = agree->valid_everywhere(ok, p, &why);
    if (ok) return p;
    if (log) std::fprintf(log, "[resume] skipping %s: %s\n", p.c_str(), why.c_str());
  }
}

}  // namespace loom::io
