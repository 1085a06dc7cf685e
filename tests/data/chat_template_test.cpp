// Chat-template interpreter: every (template, conversation) pair under tests/golden/chat_templates
// renders byte for byte as Python's jinja2 rendered it (make_golden.py, configured as transformers'
// apply_chat_template), plus unit tests of the semantics templates lean on and of bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "data/data_testing.h"
#include "loom/core/error.h"
#include "loom/data/chat_template.h"

namespace loom::data {
namespace {

using testing::read_bytes;
using Json = nlohmann::ordered_json;

const std::filesystem::path kGolden = std::filesystem::path(LOOM_SOURCE_DIR) / "tests/golden/chat_templates";

// The fixed "now" make_golden.py gives strftime_now: 2026-07-26 14:30:05, a Sunday.
ChatTemplateOptions fixed_now() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 14;
  tm.tm_min = 30;
  tm.tm_sec = 5;
  tm.tm_wday = 0;
  tm.tm_yday = 206;
  ChatTemplateOptions opt;
  opt.now = tm;
  return opt;
}

std::string render(const std::string& src, const Json& vars = Json::object()) {
  return ChatTemplate(src, "t").render(vars, fixed_now());
}

// The loom::Error message of parsing and rendering `src`; "" if there is none.
std::string error_of(const std::string& src, const Json& vars = Json::object()) {
  try {
    ChatTemplate t(src, "t");
    t.render(vars, fixed_now());
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

std::string first_difference(const std::string& got, const std::string& want) {
  size_t k = 0;
  while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
  return "first difference at byte " + std::to_string(k) + ": got \"" + got.substr(k, 40) + "\" want \"" +
         want.substr(k, 40) + "\"";
}

TEST(ChatTemplateGolden, EveryCaseMatchesJinja2) {
  const Json manifest = Json::parse(read_bytes(kGolden / "cases.json"));
  const auto& cases = manifest.at("cases");
  ASSERT_GE(cases.size(), 100u) << "golden case list missing or short: " << kGolden / "cases.json";
  size_t rendered = 0, raised = 0;
  for (const auto& c : cases) {
    const std::string tname = c.at("template").get<std::string>(), cname = c.at("conversation").get<std::string>();
    const std::string stem = tname + "__" + cname, result = c.at("result").get<std::string>();
    const std::string name = "templates/" + tname + ".jinja";
    const ChatTemplate tpl(read_bytes(kGolden / name), name);
    Json vars = Json::parse(read_bytes(kGolden / "conversations" / (cname + ".json")));
    if (!vars.contains("add_generation_prompt")) vars["add_generation_prompt"] = false;
    vars["bos_token"] = c.at("bos_token");
    vars["eos_token"] = c.at("eos_token");
    const std::string expected = read_bytes(kGolden / "expected" / (stem + "." + result));
    std::string got, error;
    try {
      got = tpl.render(vars, fixed_now());
    } catch (const loom::Error& e) {
      error = e.what();
    }
    if (result == "txt") {
      EXPECT_EQ(error, "") << stem;
      EXPECT_TRUE(got == expected) << stem << ": " << first_difference(got, expected);
      rendered += error.empty() && got == expected;
    } else if (result == "raise") {
      EXPECT_EQ(error, "[chat-template] " + name + ": the template raised: " + expected) << stem;
      raised += !error.empty();
    } else {
      EXPECT_NE(error, "") << stem << " rendered though jinja2 failed with " << expected;
      EXPECT_EQ(error.rfind("[chat-template] " + name + ":", 0), 0u) << stem << ": " << error;
    }
  }
  EXPECT_GE(rendered, 100u);
  EXPECT_GE(raised, 10u);
}

TEST(ChatTemplate, TrimBlocksAndLstripBlocksAsJinja2) {
  EXPECT_EQ(render("{% if true %}\nA\n{% endif %}\nB"), "A\nB");                    // trim_blocks eats one newline
  EXPECT_EQ(render("x\n    {% if true %}\n  y\n    {% endif %}\nz"), "x\n  y\nz");  // lstrip_blocks
  EXPECT_EQ(render("  {{ 1 }}\n"), "  1");                   // neither touches {{ }}; one trailing \n is dropped
  EXPECT_EQ(render("  {%+ if true %}k{% endif %}"), "  k");  // {%+ keeps the indentation
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a\n  {{- 'b' -}}\n  c"), "abc");
  EXPECT_EQ(render("a {# note #}\nb\n  {# indented #}\nc"), "a b\nc");
  EXPECT_EQ(render("x {% if true %}y{% endif %}"), "x y");  // text before the tag on the line: kept
  EXPECT_EQ(render("a\r\nb\r\n"), "a\nb");
  EXPECT_EQ(render("{% set x %}\n  in\n{% endset %}[{{ x }}]"), "[  in\n]");
}

TEST(ChatTemplate, LoopVariablesAndControl) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.length }}"
                   "{{ loop.first }}{{ loop.last }} {% endfor %}"),
            "1033TrueFalse 2123FalseFalse 3213FalseTrue ");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.previtem is defined }}{{ loop.nextitem }};{% endfor %}"),
            "False2;True3;True;");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in range(9) if x is even %}{{ x }}/{{ loop.length }} {% endfor %}"),
            "0/5 2/5 4/5 6/5 8/5 ");
  EXPECT_EQ(render("{% for x in range(9) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
                   "{% endif %}{{ x }}{% endfor %}"),
            "013");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}"), "a1b2");
  EXPECT_EQ(render("{% for x in [1,2] %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "ab");
}

TEST(ChatTemplate, ScopingAndNamespace) {
  // A set inside a loop body is local to that iteration; a namespace carries state out.
  EXPECT_EQ(render("{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}"), "1110");
  EXPECT_EQ(render("{% set ns = namespace(x=0) %}{% for i in range(3) %}{% set ns.x = ns.x + i %}{% endfor %}"
                   "{{ ns.x }}"),
            "3");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");  // if has no scope
  EXPECT_NE(error_of("{% set s = 'x' %}{% set s.a = 1 %}").find("not a namespace"), std::string::npos);
}

TEST(ChatTemplate, MacrosWithDefaultsAndKeywords) {
  const std::string m = "{% macro f(a, b='B', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}";
  EXPECT_EQ(render(m + "{{ f(1) }}|{{ f(1, 2) }}|{{ f(1, c=3) }}|{{ f(a=4) }}"), "1-B-None|1-2-None|1-B-3|4-B-None");
  EXPECT_NE(error_of(m + "{{ f(1, d=2) }}").find("no parameter named 'd'"), std::string::npos);
  EXPECT_NE(error_of("{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}").find("nested deeper"), std::string::npos);
}

TEST(ChatTemplate, SlicingAndIndexing) {
  EXPECT_EQ(
      render("{{ 'hello'[::-1] }} {{ [1,2,3,4][1:] }} {{ [1,2,3,4][:-1] }} {{ [1,2,3,4][::2] }} {{ 'héllo'[1] }}"),
      "olleh [2, 3, 4] [1, 2, 3] [1, 3] é");
  EXPECT_EQ(render("{{ [1,2][-1] }} {{ [1,2][5] is defined }} {{ 'ab'[9] }}|"), "2 False |");
  EXPECT_EQ(render("{{ m['role'] }}{{ m.role }}{{ m.get('x', 'dflt') }}", {{"m", {{"role", "user"}}}}), "useruserdflt");
}

TEST(ChatTemplate, TojsonMatchesPythonJsonDumps) {
  const Json vars = {{"v", Json::parse(R"({"z": "é\"\\\n\t\u0001", "a": [1, 2.5, null, true], "e": {}})")}};
  EXPECT_EQ(render("{{ v | tojson }}", vars), R"({"z": "é\"\\\n\t\u0001", "a": [1, 2.5, null, true], "e": {}})");
  EXPECT_EQ(render("{{ v.a | tojson(indent=2) }}", vars), "[\n  1,\n  2.5,\n  null,\n  true\n]");
  EXPECT_EQ(render("{{ v | tojson(sort_keys=true, separators=(',', ':')) }}", vars),
            R"({"a":[1,2.5,null,true],"e":{},"z":"é\"\\\n\t\u0001"})");
  EXPECT_EQ(render("{{ '日本🎉' | tojson }}"), "\"日本🎉\"");
  EXPECT_EQ(render("{{ '日' | tojson(true) }}"), "\"\\u65e5\"");
  EXPECT_NE(error_of("{{ nothing | tojson }}").find("not JSON serializable"), std::string::npos);
}

TEST(ChatTemplate, PrintsValuesAsPython) {
  EXPECT_EQ(render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e-05 }} {{ 2 ** 70 // 2 ** 10 if false else 10 / 4 }} {{ 1e16 }}"),
            "1.0 0.30000000000000004 1e-05 2.5 1e+16");
  EXPECT_EQ(render("{{ [none, true, 'it\\'s', {'a': (1,)}] }}"), "[None, True, \"it's\", {'a': (1,)}]");
  EXPECT_EQ(render("{{ 7 // -2 }} {{ -7 % 3 }} {{ -2 ** 2 }} {{ 'x' ~ 1 ~ none }}"), "-4 2 4 x1None");
}

TEST(ChatTemplate, UndefinedLikeJinja2) {
  EXPECT_EQ(
      render("[{{ missing }}]{{ missing is defined }}{{ missing | default('d') }}{% for x in missing %}x{% endfor %}"),
      "[]Falsed");
  EXPECT_EQ(render("{{ m.tool_calls is defined }}{{ 'tool_calls' in m }}", {{"m", {{"role", "user"}}}}), "FalseFalse");
  EXPECT_NE(error_of("{{ missing.attr }}").find("'missing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ messages[0]['role'] }}", {{"messages", Json::array()}}).find("t:1:"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + missing }}").find("'missing' is undefined"), std::string::npos);
}

TEST(ChatTemplate, StrftimeNowUsesTheGivenTime) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "26 Jul 2026");
  const std::string today = ChatTemplate("{{ strftime_now('%Y') }}", "t").render(Json::object());
  EXPECT_EQ(today.size(), 4u);
}

TEST(ChatTemplate, RaiseExceptionNamesTheTemplate) {
  EXPECT_EQ(error_of("{{ raise_exception('System role not supported') }}"),
            "[chat-template] t: the template raised: System role not supported");
}

TEST(ChatTemplate, UnsupportedConstructsFailAtLoadWithTheLine) {
  auto load_error = [](const std::string& src) {
    try {
      ChatTemplate t(src, "NAME");
    } catch (const loom::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(load_error("a\nb\n{{ x | xyz }}").rfind("[chat-template] NAME:3: unsupported filter 'xyz'", 0), 0u);
  EXPECT_NE(load_error("{% if x is frobnicated %}{% endif %}").find("unsupported test 'frobnicated'"),
            std::string::npos);
  EXPECT_NE(load_error("\n{% include 'other.jinja' %}").find("NAME:2: unsupported statement 'include'"),
            std::string::npos);
  EXPECT_NE(load_error("{% frob %}").find("unknown statement 'frob'"), std::string::npos);
  EXPECT_NE(load_error("{% endif %}").find("no open block"), std::string::npos);
  EXPECT_NE(load_error("{% break %}").find("outside a for loop"), std::string::npos);
  EXPECT_NE(load_error("ok\n{{ x | tojson(*a) }}").find("NAME:2:"), std::string::npos);
}

TEST(ChatTemplate, UnterminatedInputNamesTheLine) {
  auto load_error = [](const std::string& src) {
    try {
      ChatTemplate t(src, "T");
    } catch (const loom::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(load_error("a\n{{ x ").find("T:2: tag '{{' is never closed"), std::string::npos);
  EXPECT_NE(load_error("a\n\n{% if x ").find("T:3: tag '{%' is never closed"), std::string::npos);
  EXPECT_NE(load_error("{# open").find("T:1: comment"), std::string::npos);
  EXPECT_NE(load_error("{{ 'abc }}").find("never closed"), std::string::npos);
  EXPECT_NE(load_error("x\n{% for a in b %}\nbody").find("T:2: block opened here is never closed with {% endfor %}"),
            std::string::npos);
  EXPECT_NE(load_error("{{ (1 }}").find("T:1: unexpected '}'"), std::string::npos);
  EXPECT_NE(load_error("{{ 1 ) }}").find("unexpected ')'"), std::string::npos);
}

TEST(ChatTemplate, DeepNestingIsRefusedNotCrashed) {
  auto load_error = [](const std::string& src) {
    try {
      ChatTemplate t(src, "T");
    } catch (const loom::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      load_error("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").find("nesting deeper"),
      std::string::npos);
  EXPECT_NE(load_error("{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}").find("nesting deeper"),
            std::string::npos);
  std::string ifs;
  for (int k = 0; k < 5000; ++k) ifs += "{% if x %}";
  EXPECT_NE(load_error(ifs).find("nesting deeper"), std::string::npos);
  std::string nots;
  for (int k = 0; k < 100000; ++k) nots += "not ";
  EXPECT_NE(load_error("{{ " + nots + "x }}").find("nesting deeper"), std::string::npos);
}

TEST(ChatTemplate, SandboxLimits) {
  EXPECT_NE(error_of("{% set l = [] %}{{ l.append(1) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ range(100001) | length }}").find("sandbox limit"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 100000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=none) %}{% for i in range(2000) %}{% set ns.x = [ns.x] %}{% endfor %}")
                .find("nested deeper"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}").find("nested deeper"),
            std::string::npos);
  ChatTemplateOptions small = fixed_now();
  small.max_output_bytes = 10;
  try {
    ChatTemplate("{% for i in range(100) %}abc{% endfor %}", "t").render(Json::object(), small);
    ADD_FAILURE() << "output limit not enforced";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_output_bytes"), std::string::npos);
  }
}

TEST(ChatTemplate, AcceptsSortedNlohmannJsonToo) {
  const nlohmann::json vars = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  EXPECT_EQ(ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}", "t").render(vars),
            "user:hi");
}

}  // namespace
}  // namespace loom::data
