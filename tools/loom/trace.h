// Step traces in the loom binary: the `--trace DIR` option every `train` and `bench` takes
// (handled once, around the command) and `loom trace merge` (trace.cpp).
#pragma once
#include <string>
#include <vector>

#include "tools/loom/commands.h"

namespace loom::cli {

// Runs `loom <cmd> args`. For train and bench, `--trace DIR` (or $LOOM_TRACE_DIR, which
// is how the ranks of a relaunch inherit it) records a step trace and writes
// DIR/trace-rank<R>.json for this process's rank, also when the command throws.
int run_command(const Command& c, std::vector<std::string> args);

}  // namespace loom::cli
