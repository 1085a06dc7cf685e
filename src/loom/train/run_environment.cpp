#include "loom/train/run_environment.h"

#include <unistd.h>

#include <ctime>
#include <thread>

#include "loom/core/cpu_features.h"
#include "loom/core/threads.h"
#include "loom/kernels/cpu/blas_core.h"
#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::train {

RunEnvironment describe_run_environment() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::string& model = cpu_model_name();
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {{"hostname", host},
          {"cpu_model", model.empty() ? "unknown" : model},
          {"cpu_cores", std::to_string(std::thread::hardware_concurrency())},
          {"isa", cpu::hot_kernels_isa()},
          {"blas", "OpenBLAS, " + cpu::blas_core() + " kernels"},
          {"threads", std::to_string(num_threads())},
          {"loom_version", kLoomVersion},
          {"start_time", when}};
}

}  // namespace loom::train
