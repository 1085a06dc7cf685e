#include "loom/parallel/partition.h"

#include <algorithm>
#include <limits>

#include "loom/core/error.h"
#include "loom/model/param_layout.h"

namespace loom::parallel {

PartitionMethod partition_method_from_name(const std::string& name) {
  if (name == "uniform") return PartitionMethod::uniform;
  if (name == "parameters") return PartitionMethod::parameters;
  if (name == "profile") return PartitionMethod::profile;
  fail("config", "parallel.pp_partition: expected \"uniform\", \"parameters\" or \"profile\", got \"", name, "\"");
}

const char* partition_method_name(PartitionMethod m) {
  switch (m) {
    case PartitionMethod::uniform: return "uniform";
    case PartitionMethod::parameters: return "parameters";
    case PartitionMethod::profile: return "profile";
  }
  return "?";
}

void check_stage_count(int n_layer, int stages) {
  LOOM_CHECK(stages >= 1, "config", "parallel.pp=", stages, " must be at least 1");
  LOOM_CHECK(stages <= n_layer, "config", "parallel.pp=", stages, " exceeds model.n_layer=", n_layer,
             ": every pipeline stage needs at least one block; use parallel.pp <= ", n_layer);
}

std::vector<StageRange> partition_uniform(int L, int p) {
  check_stage_count(L, p);
  std::vector<StageRange> out;
  int first = 0;
  for (int s = 0; s < p; ++s) {
    const int n = L / p + (s < L % p ? 1 : 0);
    out.push_back({first, first + n});
    first += n;
  }
  return out;
}

std::vector<StageRange> partition_balanced(const PartitionCosts& c, int p) {
  const int L = int(c.block.size());
  check_stage_count(L, p);
  std::vector<double> prefix(size_t(L) + 1, 0.0);
  for (int l = 0; l < L; ++l) prefix[size_t(l) + 1] = prefix[size_t(l)] + c.block[size_t(l)];
  auto cost = [&](int k, int i, int j) {  // stage k owning blocks [i, j)
    return prefix[size_t(j)] - prefix[size_t(i)] + (k == 0 ? c.embedding : 0.0) + (k == p - 1 ? c.head : 0.0);
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][j]: smallest possible largest cost when stages 0..k own blocks [0, j).
  std::vector<std::vector<double>> best(size_t(p), std::vector<double>(size_t(L) + 1, kInf));
  std::vector<std::vector<int>> split(size_t(p), std::vector<int>(size_t(L) + 1, 0));
  for (int j = 1; j <= L; ++j) best[0][size_t(j)] = cost(0, 0, j);
  for (int k = 1; k < p; ++k)
    for (int j = k + 1; j <= L; ++j)
      for (int i = k; i < j; ++i) {
        const double v = std::max(best[size_t(k) - 1][size_t(i)], cost(k, i, j));
        if (v < best[size_t(k)][size_t(j)]) {
          best[size_t(k)][size_t(j)] = v;
          split[size_t(k)][size_t(j)] = i;
        }
      }
  std::vector<StageRange> out(static_cast<size_t>(p));
  int j = L;
  for (int k = p - 1; k >= 0; --k) {
    const int i = k == 0 ? 0 : split[size_t(k)][size_t(j)];
    out[size_t(k)] = {i, j};
    j = i;
  }
  return out;
}

std::vector<double> stage_costs(const std::vector<StageRange>& ranges, const PartitionCosts& c) {
  std::vector<double> out;
  for (size_t s = 0; s < ranges.size(); ++s) {
    double v = 0;
    for (int l = ranges[s].first_layer; l < ranges[s].last_layer; ++l) v += c.block.at(size_t(l));
    if (s == 0) v += c.embedding;
    if (s + 1 == ranges.size()) v += c.head;
    out.push_back(v);
  }
  return out;
}

double max_over_mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double sum = 0, mx = 0;
  for (double x : v) {
    sum += x;
    mx = std::max(mx, x);
  }
  return sum > 0 ? mx / (sum / double(v.size())) : 0;
}

PartitionCosts parameter_costs(const model::ModelConfig& cfg) {
  const model::ParamLayout layout(cfg, 1);
  PartitionCosts c;
  c.block.assign(size_t(cfg.n_layer), 0.0);
  const double vocab_rows = double(cfg.vocab_size * cfg.d_model);
  for (const auto& p : layout.params()) {
    const auto n = double(p.numel());
    if (p.layer >= 0)
      c.block[size_t(p.layer)] += n;
    else if (p.offset < layout.units().front().end)
      c.embedding += n;
    else
      c.head += n;
  }
  if (cfg.tied_embeddings) c.head += vocab_rows;  // the last stage's copy of the token table
  return c;
}

std::string describe_partition(const std::vector<StageRange>& ranges) {
  std::string s;
  for (const auto& r : ranges) s += str_cat(s.empty() ? "" : " ", "[", r.first_layer, ",", r.last_layer, ")");
  return s;
}

}  // namespace loom::parallel
