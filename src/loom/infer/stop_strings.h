// Stop strings over text that arrives a piece at a time (a generation's tokens, decoded as they
// come by decode_stream.h): where the first of them occurs, and which of the text so far can
// no longer become part of one. The engine stops generating with it; the server cuts the text
// it sends with it. Knows nothing of tokens or UTF-8: callers feed bytes.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace loom::infer {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  explicit StopStringMatcher(std::vector<std::string> stops);  // empty strings are ignored

  // Appends `text` and returns the part of everything pushed so far that is now final: up to
  // the first stop string once one appears (then stopped() is true and later calls return
  // nothing), else all but the longest tail that could still begin a stop string. The stop
  // string completed first wins (at the same end, the one starting first, then the one
  // listed first), as a stream reader sees it; the result does not depend on the pieces.
  std::string push(std::string_view text);
  // At the end of the text: what push() held back (nothing after a stop).
  std::string flush();

  bool active() const { return !stops_.empty(); }
  bool stopped() const { return stopped_; }
  const std::string& stop() const { return stop_; }  // the stop string found, if any

 private:
  std::vector<std::string> stops_;
  std::string held_;  // a suffix of the text that is a proper prefix of some stop string
  std::string stop_;
  bool stopped_ = false;
};

}  // namespace loom::infer
