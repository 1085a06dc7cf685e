// The names parallel.offload.optimizer takes.
#include "loom/optim/offload_target.h"

namespace loom::optim {

const char* offload_target_name(OffloadTarget t) {
  switch (t) {
    case OffloadTarget::none: return "none";
    case OffloadTarget::host: return "host";
    case OffloadTarget::disk: return "disk";
  }
  return "?";
}

}  // namespace loom::optim
