// Pipeline partitioners: which contiguous range of blocks each stage owns (the first stage
// also the embeddings, the last the final norm and head). Pure functions of per-block costs;
// the costs come from parameter counts (`parameters`) or from timing each block on this
// machine (`profile`, see partition_profile.h). `uniform` ignores costs.
#pragma once
#include <string>
#include <vector>

#include "loom/model/config.h"

namespace loom::parallel {

struct StageRange {
  int first_layer = 0, last_layer = 0;  // blocks [first_layer, last_layer)
  int num_layers() const { return last_layer - first_layer; }
  bool operator==(const StageRange& o) const { return first_layer == o.first_layer && last_layer == o.last_layer; }
};

enum class PartitionMethod { uniform, parameters, profile };
// "uniform", "parameters" or "profile"; throws "[config] parallel.pp_partition: ..." otherwise.
PartitionMethod partition_method_from_name(const std::string& name);
const char* partition_method_name(PartitionMethod m);  // "uniform", "parameters", "profile"

// What each piece costs, in any unit (parameters, seconds): every block, and what the first
// and the last stage carry besides their blocks.
struct PartitionCosts {
  std::vector<double> block;
  double embedding = 0;  // first stage: token (and position) embeddings
  double head = 0;       // last stage: final norm, LM head (and loss, when timed)
};

// Throws "[config] parallel.pp=5 exceeds model.n_layer=4 ..." when some stage would own no block.
void check_stage_count(int n_layer, int stages);
// Equal blocks; the first n_layer % stages stages take one more.
std::vector<StageRange> partition_uniform(int n_layer, int stages);
// Contiguous split (at least one block per stage) minimising the largest stage cost; exact
// (dynamic programming over split points).
std::vector<StageRange> partition_balanced(const PartitionCosts& costs, int stages);
std::vector<double> stage_costs(const std::vector<StageRange>& ranges, const PartitionCosts& costs);
double max_over_mean(const std::vector<double>& v);
// Parameter counts: a block's parameters; the embeddings; the final norm plus the head
// matrix (a tied head is a copy of the token embedding on the last stage, so it counts).
PartitionCosts parameter_costs(const model::ModelConfig& cfg);
// "[0,3) [3,6) ..." for logs.
std::string describe_partition(const std::vector<StageRange>& ranges);

}  // namespace loom::parallel
