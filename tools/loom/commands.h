// Registry of loom subcommands, and how each declares and parses its options (CLI11).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace loom::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Command {
  std::string name, help;
  std::function<int(const std::vector<std::string>&)> run;
};
const std::vector<Command>& commands();

// `loom bench <what>`: dispatches to the benchmarks of bench/ (bench/loom/bench.h).
int cmd_bench(const std::vector<std::string>& args);
int cmd_launch(const std::vector<std::string>& args);
int cmd_version(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_chat_template(const std::vector<std::string>& args);
int cmd_prepare(const std::vector<std::string>& args);
int cmd_train(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_chat(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_quantize(const std::vector<std::string>& args);
int cmd_convert(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_plan(const std::vector<std::string>& args);
int cmd_trace(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);

// The binary `loom launch` starts on every rank: $LOOM_LAUNCH_EXE, else this one.
std::string launch_exe();

// ---- options: every command declares them on a CLI::App ---------------------------------
//
//   auto app = new_app("generate", "Streams a continuation of TEXT ...");
//   app->add_option("--max-tokens", max_tokens, "tokens to generate")->check(positive());
//   if (auto rc = parse(*app, args)) return *rc;
//
// --help then lists exactly what parses, with types, ranges and defaults.

// The App of `loom <path>` ("generate", "bench train"): -h/--help, defaults shown, and (train
// and every bench) the --trace DIR that run_command handles (trace.h).
std::unique_ptr<CLI::App> new_app(const std::string& path, const std::string& description);

// Parses args into app's options. nullopt: run the command; a value: exit with it now, after
// --help, or in the modes tests/cli/options_test.sh drives: $LOOM_CLI_DESCRIBE=1 prints the
// declared options (one per line) without parsing, $LOOM_CLI_PARSE_ONLY=1 parses and prints
// the values. Unknown options, bad values and an option (other than a list) given twice
// throw UsageError naming the option.
std::optional<int> parse(CLI::App& app, const std::vector<std::string>& args);
// `loom`, `loom bench`, `loom trace` under $LOOM_CLI_DESCRIBE=1: their subcommands, so the
// test walks the registry. False (print nothing) outside that mode.
bool describe_subcommands(const std::vector<std::string>& names);
// Whether $LOOM_CLI_DESCRIBE or $LOOM_CLI_PARSE_ONLY is set: parse() will exit before running.
bool parse_only_mode();

// Checks for numeric options whose error names the value: "must be positive, got 0".
CLI::Validator positive();                      // > 0
CLI::Validator non_negative();                  // >= 0
CLI::Validator in_range(double lo, double hi);  // lo <= x <= hi
// One of the names: "--role hub: expected center or edge".
CLI::Validator one_of(std::vector<std::string> names);

}  // namespace loom::cli
