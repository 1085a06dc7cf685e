// The loom command-line tool: one binary, a subcommand per job. main() is the only place
// that turns errors into exit codes.
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/exit_status.h"
#include "loom/kernels/cpu/blas_core.h"
#include "tools/loom/commands.h"
#include "tools/loom/trace.h"

namespace {

void print_usage() {
  std::printf("usage: loom <command> [options]\n\ncommands:\n");
  for (const auto& c : loom::cli::commands()) std::printf("  %-12s %s\n", c.name.c_str(), c.help.c_str());
  std::printf("\nrun `loom <command> --help` for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS chose its kernels when it loaded; when it fell back to generic SSE ones on a CPU
  // with AVX2 or AVX-512 (loom/kernels/cpu/blas_core.h), start again with the right ones.
  if (const std::string core = loom::cpu::blas_core_fix(); !core.empty()) {
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    execv("/proc/self/exe", argv);  // returns only on failure: go on with the slow kernels
  }
  std::vector<std::string> names;
  for (const auto& c : loom::cli::commands()) names.push_back(c.name);
  if (argc < 2 && loom::cli::describe_subcommands(names)) return 0;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? loom::kExitUsage : loom::kExitOk;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    for (const auto& c : loom::cli::commands())
      if (c.name == cmd) return loom::cli::run_command(c, args);
    std::fprintf(stderr, "loom: unknown command '%s'\n\n", cmd.c_str());
    print_usage();
    return loom::kExitUsage;
  } catch (const loom::cli::UsageError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return loom::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return loom::kExitError;
  }
}
