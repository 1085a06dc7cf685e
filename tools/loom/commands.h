// Registry of loom subcommands and the small argument parser they share.
#pragma once
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Command {
  std::string name;
  std::function<int(const std::vector<std::string>&)> run;
};
const std::vector<Command>& commands();

int cmd_bench(const std::vector<std::string>& args);
int cmd_launch(const std::vector<std::string>& args);
int cmd_version(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_prepare(const std::vector<std::string>& args);
int cmd_train(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_quantize(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);
int cmd_trace(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);

// `loom bench <what>`: one function per benchmark, listed in bench.cpp.
struct Benchmark {
  std::string name, help;
  std::function<int(const std::vector<std::string>&)> run;
};
const std::vector<Benchmark>& benchmarks();
int bench_train(const std::vector<std::string>& args);
int bench_train_dp(const std::vector<std::string>& args);
int bench_tokenize(const std::vector<std::string>& args);
int bench_serve(const std::vector<std::string>& args);
int bench_comm(const std::vector<std::string>& args);
int bench_infer(const std::vector<std::string>& args);
int bench_pipeline(const std::vector<std::string>& args);
int bench_moe(const std::vector<std::string>& args);
int bench_checkpoint(const std::vector<std::string>& args);
int bench_chaos(const std::vector<std::string>& args);
int bench_cascade(const std::vector<std::string>& args);

int cmd_launch(const std::vector<std::string>& args);
// Runs `loom bench <bench> args...` as ranks of `loom launch`, with the --nproc and --hosts
// of args (--nproc defaults to the hosts' slots); every other option passes through.
int relaunch_bench(const std::string& bench, const std::vector<std::string>& args);
// The binary `loom launch` starts on every rank: $LOOM_LAUNCH_EXE, else this one.
std::string launch_exe();

// How an option is given: `false` a flag, `true` one value, Args::kRepeated a value that may
// be given several times (--set a=1 --set b=2).
struct OptionKind {
  bool takes_value = false, repeatable = false;
  OptionKind(bool value) : takes_value(value) {}  // NOLINT: {"name", true} reads best in specs
  OptionKind(bool value, bool repeat) : takes_value(value), repeatable(repeat) {}
};

// --key value / --key=value / --flag parsing against a declared option list.
class Args {
 public:
  static inline const OptionKind kRepeated{true, true};
  // spec: option name -> its kind. Unknown options, and an option that is not repeatable
  // given twice (which value was meant?), throw UsageError naming them.
  Args(const std::string& cmd, const std::vector<std::string>& argv,
       const std::map<std::string, OptionKind>& spec);
  bool has(const std::string& k) const { return values_.count(k) != 0; }
  std::string get(const std::string& k, const std::string& def) const;
  std::vector<std::string> get_all(const std::string& k) const;
  int64_t get_int(const std::string& k, int64_t def) const;
  double get_double(const std::string& k, double def) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string cmd_;
  std::multimap<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace loom::cli
