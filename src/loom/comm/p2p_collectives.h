// The collective algorithms of algorithm.h run over point-to-point messages (internal to
// src/loom/comm): a Backend that wraps a transport (MPI) and runs all-reduce,
// reduce-scatter and all-gather as ring, tree or hierarchical exchanges on a private
// duplicate of the transport's communicator, or passes them to the transport ("mpi").
// Every other operation goes to the transport unchanged.
#pragma once
#include <memory>
#include <vector>

#include "loom/comm/algorithm.h"
#include "loom/comm/backend.h"

namespace loom::comm {

// Collective over `transport`'s members (it creates the private communicator).
// `host_of_world_rank`: the host id of every world rank; `algorithm`: what this group runs
// until Backend::use_algorithm says otherwise. Groups split from the result inherit both.
std::unique_ptr<Backend> make_algorithm_backend(std::unique_ptr<Backend> transport, std::vector<int> host_of_world_rank,
                                                Algorithm algorithm, std::shared_ptr<const CostModel> model);

}  // namespace loom::comm
