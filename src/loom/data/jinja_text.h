// Text helpers with Python's str semantics over UTF-8 bytes: code-point counting and slicing,
// whitespace (str.isspace), case mapping (ASCII letters only) and JSON string escaping.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data::jinja {

// Byte offsets of each code point start, plus the total size at the end.
std::vector<size_t> code_point_offsets(std::string_view s);
size_t code_point_count(std::string_view s);
// Decodes the code point at `pos` (ill-formed bytes decode as themselves); sets `len`.
uint32_t decode_at(std::string_view s, size_t pos, int& len);

// Python's str.isspace for one code point.
bool is_py_space(uint32_t cp);
// str.strip()/lstrip()/rstrip() with no argument (Unicode whitespace) or with a set of characters.
std::string py_strip(std::string_view s, bool left, bool right);
std::string py_strip_chars(std::string_view s, std::string_view chars, bool left, bool right);
// str.split() with no separator: runs of whitespace, no empty parts; at most `maxsplit` splits.
std::vector<std::string> py_split_ws(std::string_view s, int64_t maxsplit);
std::vector<std::string> py_split(std::string_view s, std::string_view sep, int64_t maxsplit);
std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);

std::string ascii_upper(std::string_view s);
std::string ascii_lower(std::string_view s);
// str.title() (Python) and str.capitalize().
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);

// A JSON string literal as json.dumps(ensure_ascii=False) writes it.
void append_json_string(std::string& out, std::string_view s);

}  // namespace loom::data::jinja
