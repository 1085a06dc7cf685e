// Error reporting for all of loom: exceptions whose message starts with "[where]".
// Library code throws loom::Error; only main() decides how a process ends.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
inline void append_all(std::ostringstream&) {}
template <class A, class... R>
void append_all(std::ostringstream& os, const A& a, const R&... rest) {
  os << a;
  append_all(os, rest...);
}
}  // namespace detail

// Concatenates any streamable parts into one string.
template <class... A>
std::string str_cat(const A&... parts) {
  std::ostringstream os;
  detail::append_all(os, parts...);
  return os.str();
}

// Throws loom::Error("[where] parts...").
template <class... A>
[[noreturn]] void fail(std::string_view where, const A&... parts) {
  throw Error(str_cat("[", where, "] ", parts...));
}

}  // namespace loom

// LOOM_CHECK(cond, "op", "message parts", ...): throws "[op] message parts" when cond is false.
#define LOOM_CHECK(cond, where, ...)               \
  do {                                             \
    if (!(cond)) ::loom::fail(where, __VA_ARGS__); \
  } while (0)
