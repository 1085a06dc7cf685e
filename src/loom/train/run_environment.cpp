#include "loom/train/run_environment.h"

#include <unistd.h>

#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

#include "loom/core/threads.h"
#include "loom/kernels/cpu/blas_core.h"
#include "loom/kernels/cpu/cpu_kernels.h"

namespace loom::train {

std::string cpu_model_from_cpuinfo(const std::string& cpuinfo) {
  std::istringstream in(cpuinfo);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

RunEnvironment describe_run_environment() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::ifstream f("/proc/cpuinfo");
  std::stringstream cpuinfo;
  cpuinfo << f.rdbuf();
  const std::string model = cpu_model_from_cpuinfo(cpuinfo.str());
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
