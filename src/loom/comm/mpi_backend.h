// Entry points of the MPI backend used by World (internal to src/loom/comm). Callers must
// have initialised MPI at MPI_THREAD_MULTIPLE.
// Library loom_comm_mpi (the part of comm that links MPI; src/CMakeLists.txt).
#pragma once
#include <memory>

#include "loom/comm/backend.h"

namespace loom::comm {

// A backend over a duplicate of MPI_COMM_WORLD.
std::unique_ptr<Backend> make_mpi_world_backend();
// Throws "[comm] <what> failed: <MPI's message>" unless rc is MPI_SUCCESS.
void mpi_check(int rc, const char* what);

}  // namespace loom::comm
