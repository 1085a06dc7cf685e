// The world group of the MPI test binary (set up by tests/comm/mpi/main.cpp).
#pragma once
#include "loom/comm/world.h"

const loom::comm::Group& test_world();
