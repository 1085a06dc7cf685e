// NCCL groups: collectives on CUDA tensors over NCCL, bootstrapped through an existing
// (MPI) group. Built from nccl/nccl_backend.cpp when CUDA is available; otherwise
// no_nccl/no_nccl.cpp provides versions that say so.
#pragma once
#include <string>

#include "loom/comm/group.h"

namespace loom::comm {

bool nccl_available();
std::string nccl_describe();  // "nccl 2.27.3" or why not
// Collective over `bootstrap`: every rank passes the CUDA device it drives; the new group
// has the same ranks and takes tensors on that device. Shares bootstrap's record.
Group nccl_group(const Group& bootstrap, int cuda_device, const std::string& name = "");

}  // namespace loom::comm
