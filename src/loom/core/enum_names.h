// An enum's names as one table read both ways: the name a value prints as, and the value a
// name parses to, so that printing and parsing cannot disagree. Lookup only; the caller words
// its own error for a name that is not in the table.
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>

namespace loom {

template <class E>
using EnumName = std::pair<E, const char*>;

// The first name of `value` in the table; `unnamed` when it has none (a number read from a
// file may be any value of the underlying type).
template <class E, size_t N>
constexpr const char* enum_name(const EnumName<E> (&names)[N], E value, const char* unnamed = "?") {
  for (const auto& [e, name] : names)
    if (e == value) return name;
  return unnamed;
}

// The value `text` names (any of a value's names); nullopt when none.
template <class E, size_t N>
constexpr std::optional<E> enum_from_name(const EnumName<E> (&names)[N], std::string_view text) {
  for (const auto& [e, name] : names)
    if (text == name) return e;
  return std::nullopt;
}

}  // namespace loom
