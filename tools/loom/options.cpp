// How every loom command declares and parses its options (commands.h): CLI11 apps whose
// --help is generated from the declarations, and the describe / parse-only modes that
// tests/cli/options_test.sh uses to check that every documented option parses.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "loom/core/error.h"
#include "tools/loom/commands.h"

namespace loom::cli {

namespace {

constexpr const char* kTraceHelp =
    "write a Chrome/Perfetto trace of this run per rank to DIR/trace-rank<R>.json (blocks' forward/backward, "
    "optimizer, collectives with bytes, pipeline transfers, waits); `loom trace merge DIR` puts the ranks on "
    "one timeline";

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// "[generate]" for the App of `loom generate`.
std::string tag(const CLI::App& app) {
  std::string name = app.get_name();
  if (name.rfind("loom ", 0) == 0) name = name.substr(5);
  return "[" + name + "]";
}

// One line per declared option: kind, name, type, default ("-" when none), required (0/1).
// Tabs separate.
void describe(const CLI::App& app) {
  std::printf("loom-cli-options\t%s\n", app.get_name().c_str());
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_name() == "--help") continue;
    const char* kind = o->get_positional()          ? "positional"
                       : o->get_expected_max() == 0 ? "flag"
                       : o->get_expected_max() > 1  ? "list"
                                                    : "value";
    const std::string name = o->get_positional()       ? o->get_name(true)
                             : o->get_lnames().empty() ? "-" + o->get_snames().at(0)
                                                       : "--" + o->get_lnames()[0];
    const std::string type = o->get_type_name(), def = o->get_default_str();
    std::printf("%s\t%s\t%s\t%s\t%d\n", kind, name.c_str(), type.empty() ? "-" : type.c_str(),
                def.empty() ? "-" : def.c_str(), o->get_required() ? 1 : 0);
  }
}

// Words of `text` in lines of at most `width` characters (existing line breaks kept).
std::string wrap(const std::string& text, size_t width) {
  std::string out, line, word;
  auto flush_word = [&] {
    if (word.empty()) return;
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    word.clear();
  };
  for (char c : text) {
    if (c == ' ' || c == '\n') {
      flush_word();
      if (c == '\n') {
        out += line + "\n";
        line.clear();
      }
    } else {
      word += c;
    }
  }
  flush_word();
  return out + line;
}

// CLI11's help with the descriptions wrapped to a terminal's width.
class WrappingFormatter : public CLI::Formatter {
 public:
  static constexpr size_t kWidth = 100, kColumn = 34;
  WrappingFormatter() { column_width(kColumn); }
  std::string make_description(const CLI::App* app) const override {
    const std::string d = app->get_description();
    return d.empty() ? std::string() : wrap(d, kWidth) + "\n";
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    return wrap(opt->get_description(), kWidth - kColumn);
  }
};

// The number text holds, or nullopt when it is not one.
std::optional<double> number(const std::string& text) {
  size_t pos = 0;
  try {
    const double x = std::stod(text, &pos);
    if (pos == text.size()) return x;
  } catch (...) {
  }
  return std::nullopt;
}

std::string not_a_number(const std::string& text) { return "expected a number, got \"" + text + "\""; }

}  // namespace

std::unique_ptr<CLI::App> new_app(const std::string& path, const std::string& description) {
  auto app = std::make_unique<CLI::App>(description, "loom " + path);
  app->option_defaults()->always_capture_default();
  // An option given twice is refused in parse(), naming both values, not silently one of them.
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->formatter(std::make_shared<WrappingFormatter>());
  if (path == "train" || path.rfind("bench ", 0) == 0) app->add_option("--trace", kTraceHelp)->type_name("DIR");
  return app;
}

std::optional<int> parse(CLI::App& app, const std::vector<std::string>& args) {
  if (env_on("LOOM_CLI_DESCRIBE")) {
    describe(app);
    return 0;
  }
  // One value per occurrence, as --stop a --stop b: a list option must not swallow the
  // positional arguments after it.
  for (CLI::Option* o : app.get_options())
    if (!o->get_positional()) o->allow_extra_args(false);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ExtrasError&) {
    const std::vector<std::string> extra = app.remaining();
    const std::string first = extra.empty() ? std::string("?") : extra[0];
    throw UsageError(str_cat(tag(app), first.rfind("-", 0) == 0 ? " unknown option " : " unexpected argument '", first,
                             first.rfind("-", 0) == 0 ? "" : "'", " (see ", app.get_name(), " --help)"));
  } catch (const CLI::ConversionError& e) {
    // "Could not convert: --name = value"
    const std::string what = e.what(), prefix = "Could not convert: ";
    const size_t eq = what.find(" = ");
    if (what.rfind(prefix, 0) != 0 || eq == std::string::npos) throw UsageError(str_cat(tag(app), " ", what));
    const std::string name = what.substr(prefix.size(), eq - prefix.size()), value = what.substr(eq + 3);
    const CLI::Option* o = app.get_option_no_throw(name);
    const bool integer = o && (o->get_type_name().rfind("INT", 0) == 0 || o->get_type_name().rfind("UINT", 0) == 0);
    throw UsageError(str_cat(tag(app), " ", name, ": expected ", integer ? "an integer" : "a number", ", got \"", value,
                             "\" (see ", app.get_name(), " --help)"));
  } catch (const CLI::ParseError& e) {
    // CLI11 says "--name: problem"; ours read "[cmd] --name problem".
    std::string what = e.what();
    if (what.find(" required ") != std::string::npos && what.ends_with(" missing"))  // "--x: 1 required T missing"
      what = what.substr(0, what.find(':')) + " needs a value";
    if (what.rfind("--", 0) == 0)
      if (auto colon = what.find(": "); colon != std::string::npos) what.erase(colon, 1);
    throw UsageError(str_cat(tag(app), " ", what, " (see ", app.get_name(), " --help)"));
  }
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_positional() || o->get_expected_max() > 1 || o->count() < 2) continue;
    const std::string name = o->get_name(false, true);
    const auto& r = o->results();
    throw UsageError(
        o->get_expected_max() == 0 || r.size() < 2
            ? str_cat(tag(app), " ", name, " is given twice; give it once")
            : str_cat(tag(app), " ", name, " is given twice (\"", r[0], "\" and \"", r[1], "\"); give it once"));
  }
  if (env_on("LOOM_CLI_PARSE_ONLY")) {
    std::printf("loom-cli-parsed\t%s\n%s", app.get_name().c_str(), app.config_to_str(true, false).c_str());
    return 0;
  }
  return std::nullopt;
}

bool parse_only_mode() { return env_on("LOOM_CLI_DESCRIBE") || env_on("LOOM_CLI_PARSE_ONLY"); }

bool describe_subcommands(const std::vector<std::string>& names) {
  if (!env_on("LOOM_CLI_DESCRIBE")) return false;
  std::printf("loom-cli-subcommands\n");
  for (const auto& n : names) std::printf("subcommand\t%s\n", n.c_str());
  return true;
}

CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const auto x = number(text);
        if (!x) return not_a_number(text);
        return *x > 0 ? std::string() : "must be positive, got " + text;
      },
      "POSITIVE");
}

CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const auto x = number(text);
        if (!x) return not_a_number(text);
        return *x >= 0 ? std::string() : "must not be negative, got " + text;
      },
      "NONNEGATIVE");
}

CLI::Validator in_range(double lo, double hi) {
  auto text = [](double x) {
    return x == std::floor(x) && std::abs(x) < 1e15 ? std::to_string(int64_t(x)) : str_cat(x);
  };
  const std::string range = text(lo) + " to " + text(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        const auto x = number(text);
        if (!x) return not_a_number(text);
        return *x >= lo && *x <= hi ? std::string() : "must be " + range + ", got " + text;
      },
      "in " + range);
}

CLI::Validator one_of(std::vector<std::string> names) {
  std::string list, braces;
  for (size_t i = 0; i < names.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    braces += (i == 0 ? "" : ",") + names[i];
  }
  return CLI::Validator(
      [names, list](std::string& text) -> std::string {
        for (const auto& n : names)
          if (n == text) return std::string();
        return names.size() == 1 ? text + ": only '" + names[0] + "' is supported" : text + ": expected " + list;
      },
      "{" + braces + "}");
}

}  // namespace loom::cli
