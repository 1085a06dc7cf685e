#include "tools/loom/commands.h"

#include <cstdio>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/blas_core.h"
#include "loom/kernels/cpu/cpu_kernels.h"
#include "loom/kernels/cuda/cuda_ops.h"
#include "loom/train/run_environment.h"

namespace loom::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> cmds = {
      {"bench", cmd_bench},
      {"serve", cmd_serve},
      {"launch", cmd_launch},
      {"version", cmd_version},
      {"tokenize", cmd_tokenize},
      {"prepare", cmd_prepare},
      {"train", cmd_train},
      {"generate", cmd_generate},
      {"quantize", cmd_quantize},
      {"eval", cmd_eval},
      {"trace", cmd_trace},
      {"report", cmd_report},
      {"plan", cmd_plan},
  };
  return cmds;
}

int cmd_version(const std::vector<std::string>&) {
  std::printf("loom %s\ncpu kernels: %s\nBLAS: OpenBLAS, %s kernels\n%s\n", train::kLoomVersion, cpu::hot_kernels_isa().c_str(),
              cpu::blas_core().c_str(), cuda::describe().c_str());
  return 0;
}

namespace {

// `args` without the named options (each "--name value" or "--name=value").
std::vector<std::string> without_options(const std::vector<std::string>& args,
                                         const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool drop = false;
    for (const auto& n : names) {
      if (args[i] == n) {
        ++i;  // and its value
        drop = true;
      } else if (args[i].rfind(n + "=", 0) == 0) {
        drop = true;
      }
      if (drop) break;
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

// The value of option `name` in args ("--name value" or "--name=value"), or "".
std::string option_value(const std::vector<std::string>& args, const std::string& name) {
  std::string v;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name && i + 1 < args.size()) v = args[i + 1];
    if (args[i].rfind(name + "=", 0) == 0) v = args[i].substr(name.size() + 1);
  }
  return v;
}

}  // namespace

int relaunch_bench(const std::string& bench, const std::vector<std::string>& args) {
  const std::string hosts = option_value(args, "--hosts");
  std::string nproc = option_value(args, "--nproc");
  if (nproc.empty()) nproc = std::to_string(comm::slots_in_hosts(hosts));
  std::vector<std::string> launch = {"--nproc", nproc};
  if (!hosts.empty()) launch.insert(launch.end(), {"--hosts", hosts});
  launch.insert(launch.end(), {"--", "bench", bench});
  for (const auto& s : without_options(args, {"--nproc", "--hosts"})) launch.push_back(s);
  return cmd_launch(launch);
}

Args::Args(const std::string& cmd, const std::vector<std::string>& argv,
           const std::map<std::string, OptionKind>& spec)
    : cmd_(cmd) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
      inline_value = true;
    }
    auto it = spec.find(key);
    if (it == spec.end()) throw UsageError(str_cat("[", cmd, "] unknown option --", key, " (see loom ", cmd, " --help)"));
    if (it->second.takes_value && !inline_value) {
      if (i + 1 >= argv.size()) throw UsageError(str_cat("[", cmd, "] --", key, " needs a value"));
      value = argv[++i];
    }
    if (!it->second.repeatable && values_.count(key)) {
      const std::string first = values_.find(key)->second;
      throw UsageError(it->second.takes_value
                           ? str_cat("[", cmd, "] --", key, " is given twice (\"", first, "\" and \"", value,
                                     "\"); give it once")
                           : str_cat("[", cmd, "] --", key, " is given twice; give it once"));
    }
    values_.emplace(key, value);
  }
}

std::string Args::get(const std::string& k, const std::string& def) const {
  auto it = values_.find(k);
  return it == values_.end() ? def : it->second;
}

std::vector<std::string> Args::get_all(const std::string& k) const {
  std::vector<std::string> out;
  for (auto [it, end] = values_.equal_range(k); it != end; ++it) out.push_back(it->second);
  return out;
}

int64_t Args::get_int(const std::string& k, int64_t def) const {
  if (!has(k)) return def;
  std::string v = get(k, "");
  try {
    size_t pos = 0;
    int64_t x = std::stoll(v, &pos);
    if (pos == v.size()) return x;
  } catch (...) {
  }
  throw UsageError(str_cat("[", cmd_, "] --", k, ": expected an integer, got \"", v, "\""));
}

double Args::get_double(const std::string& k, double def) const {
  if (!has(k)) return def;
  std::string v = get(k, "");
  try {
    size_t pos = 0;
    double x = std::stod(v, &pos);
    if (pos == v.size()) return x;
  } catch (...) {
  }
  throw UsageError(str_cat("[", cmd_, "] --", k, ": expected a number, got \"", v, "\""));
}

}  // namespace loom::cli
