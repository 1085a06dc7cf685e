// Where an offloaded rank keeps its Adam moments between steps (parallel.offload.optimizer;
// optim/moment_offload.h stages them).
#pragma once

namespace loom::optim {

enum class OffloadTarget { none, host, disk };
const char* offload_target_name(OffloadTarget t);  // "none", "host", "disk"

}  // namespace loom::optim
