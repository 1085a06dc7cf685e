// Collective algorithms and how loom chooses between them: which algorithm an all-reduce,
// reduce-scatter or all-gather of a group runs (ring, recursive doubling/halving "tree",
// two-level hierarchical, or the MPI library's own), the alpha-beta cost model `auto` uses,
// the topology it is evaluated on (which host each rank is on), and the calibration file
// `loom bench comm --calibrate` writes. Pure arithmetic and file IO; the algorithms
// themselves run in the comm worker (p2p_collectives.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/core/dtype.h"

namespace loom::comm {

enum class ReduceOp : uint8_t;

enum class Algorithm : uint8_t { auto_select, ring, tree, hierarchical, mpi };
const char* algorithm_name(Algorithm a);  // "auto", "ring", "tree", "hierarchical", "mpi"
// Throws "[comm] comm.algorithm 'x' is not one of auto, ring, tree, hierarchical, mpi".
Algorithm parse_algorithm(const std::string& text);

// The collectives that have algorithms; the others always go to the transport.
enum class CollectiveOp : uint8_t { all_reduce, reduce_scatter, all_gather };
const char* collective_op_name(CollectiveOp op);

// Which host each member of a group is on (host ids are arbitrary integers, equal for
// members on one host), and what follows from it.
struct Topology {
  std::vector<int> host_of;  // indexed by group rank
  int size() const { return int(host_of.size()); }
  int hosts() const;
  // Ranks per host when every host has the same number, else 0 (hierarchical then falls
  // back to ring).
  int uniform_local_size() const;
  // Group ranks in host order then rank order: hosts ordered by their lowest rank.
  // host_index(r) and local_index(r) locate rank r in that grid.
  int host_index(int rank) const;
  int local_index(int rank) const;
  // Members of `rank`'s host, by rank; members with the same local index, by host.
  std::vector<int> host_members(int rank) const;
  std::vector<int> peers_across_hosts(int rank) const;
};

// Latency (seconds per message) and inverse bandwidth (seconds per byte) of a link.
struct LinkCost {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  double gbps() const { return beta_s_per_byte > 0 ? 1e-9 / beta_s_per_byte : 0; }
};

// Costs of the link classes and of reducing in memory, plus measured times of the
// algorithms on a given group shape (the MPI library's cannot be modelled at all: they
// depend on its tuning).
struct CostModel {
  LinkCost intra{5e-6, 1.0 / 8e9};       // ranks on one host (shared memory)
  LinkCost inter{50e-6, 1.0 / 1e9};      // ranks on different hosts (one link per host)
  double reduce_s_per_byte = 1.0 / 4e9;  // reading two operands and writing one
  bool calibrated = false;
  std::string source = "built-in defaults";
  // Key "ring/all_reduce/<ranks>/<hosts>" -> {bytes -> seconds}.
  std::map<std::string, std::map<int64_t, double>> measured;

  static std::string key(Algorithm a, CollectiveOp op, int ranks, int hosts);
  // Measured time of `a` at `bytes`, interpolated in log-log space between measured sizes
  // (linear in bytes beyond the largest); < 0 when not measured for this group shape.
  double measured_time(Algorithm a, CollectiveOp op, int ranks, int hosts, int64_t bytes) const;
};

// Modelled seconds of `a` (ring, tree or hierarchical; mpi from the measured table, < 0
// when unknown) for a collective over `bytes` (the full buffer: all-reduce's tensor,
// reduce-scatter's input, all-gather's output). Ranks of a host share its one link to the
// other hosts, so flows that cross hosts at once divide its bandwidth.
double predict_seconds(Algorithm a, CollectiveOp op, int64_t bytes, const Topology& topo, const CostModel& m);

// What `auto` runs: the candidate with the least expected time, measured where the model
// holds a measurement for this group shape and size range, modelled otherwise. One host
// without measurements: mpi (the transport's shared-memory collectives).
Algorithm choose_algorithm(CollectiveOp op, int64_t bytes, const Topology& topo, const CostModel& m);

// The algorithm (ring or tree) of hierarchical's cross-host phase, for a share of
// `share_bytes` per rank: one choice for the model and for the run.
Algorithm cross_phase_algorithm(CollectiveOp op, int64_t share_bytes, const Topology& topo, const CostModel& m);

// What `requested` actually runs for this call: auto resolved; hierarchical on one host or
// on hosts of unequal rank counts becomes ring; tree where recursive halving/doubling needs
// a power-of-two size (reduce-scatter, all-gather) becomes ring; one rank: mpi (a copy).
Algorithm resolve_algorithm(Algorithm requested, CollectiveOp op, int64_t bytes, const Topology& topo,
                            const CostModel& m);

// dst[i] = dst[i] op src[i] for n elements of dtype `t`: the reduction step of the ring,
// tree and hierarchical algorithms (avg sums; the caller divides). bf16 adds in f32 and
// rounds once, like the MPI backend's user operation.
void reduce_into(void* dst, const void* src, int64_t n, DType t, ReduceOp op);

// The calibration file: "key value" lines, '#' comments. Keys: intra_alpha_us, intra_gbps,
// inter_alpha_us, inter_gbps, reduce_gbps, and "time <algorithm> <op> <ranks> <hosts> <bytes> <us>".
// Throws naming the file and line on a malformed entry.
CostModel load_cost_model(const std::string& path);
void save_cost_model(const CostModel& m, const std::string& path);

}  // namespace loom::comm
