// The benchmarks behind `loom bench <what>` (the loom_bench library): their registry, one entry
// function per benchmark, and the helpers every benchmark's options use. The loom tool's
// options and commands they build on are in tools/loom/commands.h; nothing there depends on this.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/group.h"
#include "tools/loom/commands.h"

namespace loom::cli {

// One benchmark: its name after `loom bench`, a line of help, and its entry (args after the name).
using Benchmark = Command;
const std::vector<Benchmark>& benchmarks();  // listed in bench.cpp
int bench_train(const std::vector<std::string>& args);
int bench_finetune(const std::vector<std::string>& args);
int bench_tokenize(const std::vector<std::string>& args);
int bench_serve(const std::vector<std::string>& args);
int bench_comm(const std::vector<std::string>& args);
int bench_infer(const std::vector<std::string>& args);
int bench_pipeline(const std::vector<std::string>& args);
int bench_moe(const std::vector<std::string>& args);
int bench_checkpoint(const std::vector<std::string>& args);
int bench_chaos(const std::vector<std::string>& args);
int bench_cascade(const std::vector<std::string>& args);
int bench_guards(const std::vector<std::string>& args);

// new_app("bench <name>") with the description benchmarks() gives it, then `details`.
std::unique_ptr<CLI::App> bench_app(const std::string& name, const std::string& details = "");

// An option whose default the run picks (its help says which, e.g. "default 60; --quick 12"), so
// --help shows none and count() tells a given value from it: add_option(name, value, help),
// then type_name(type) unless empty, check(check) and an empty default_str.
template <class T>
CLI::Option* add_run_default_option(CLI::App& app, const std::string& name, T& value, const std::string& help,
                                    const std::string& type, const CLI::Validator& check) {
  CLI::Option* o = app.add_option(name, value, help);
  if (!type.empty()) o->type_name(type);
  return o->check(check)->default_str("");
}

// A new, empty directory /tmp/PREFIX-XXXXXX (mkdtemp) for a benchmark's runs; throws when it cannot.
std::string new_temp_dir(const std::string& prefix);

// One-way time of a `bytes` message between rank 0 and `peer` of `g` (half the median of `iters`
// round trips, after two untimed ones); every rank returns rank 0's figure. Collective over g.
double one_way_seconds(const comm::Group& g, int peer, int64_t bytes, int iters);

// Runs `loom bench <bench> args...` as ranks of `loom launch`, with the --nproc and --hosts
// of args (--nproc defaults to the hosts' slots); every other option passes through.
int relaunch_bench(const std::string& bench, const std::vector<std::string>& args);

}  // namespace loom::cli
