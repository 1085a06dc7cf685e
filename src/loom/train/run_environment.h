// What a run's report says about where it ran: host, CPU model, the kernels' instruction set,
// BLAS, threads, loom's version and the start time, as ordered name/value pairs for the
// metrics JSONL's run_start line. Reads /proc/cpuinfo; no side effects.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace loom::train {

// The version `loom version` prints.
inline constexpr const char* kLoomVersion = "0.1.0";

using RunEnvironment = std::vector<std::pair<std::string, std::string>>;

// hostname, cpu_model, cpu_cores, isa, blas, threads, loom_version, start_time (UTC, ISO 8601).
RunEnvironment describe_run_environment();

}  // namespace loom::train
