// Stop-string matching (see stop_strings.h). Invariant: text returned by push() never ends in
// a proper prefix of a stop string, so a match can only begin inside held_; the work per push
// is bounded by the new text plus the longest stop string, whatever the length of the output.
#include "loom/infer/stop_strings.h"

#include <algorithm>
#include <utility>

namespace loom::infer {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {};
  std::string pending = std::move(held_);
  held_.clear();
  pending.append(text);
  if (stops_.empty()) return pending;
  // The stop that is complete first wins, so the result does not depend on how the text was
  // split into pieces: the earliest end, then the earliest start, then list order.
  size_t first = std::string::npos, end = std::string::npos;
  for (const auto& s : stops_)
    if (const size_t at = pending.find(s); at != std::string::npos)
      if (at + s.size() < end || (at + s.size() == end && at < first)) {
        first = at;
        end = at + s.size();
        stop_ = s;
      }
  if (first != std::string::npos) {
    stopped_ = true;
    pending.resize(first);
    return pending;
  }
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending.size()); k > hold; --k)
      if (pending.compare(pending.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  held_ = pending.substr(pending.size() - hold);
  pending.resize(pending.size() - hold);
  return pending;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

}  // namespace loom::infer
