// The edge's answer to a request (docs/CASCADE.md): its confidence, the mean probability of the
// first window's tokens under its model, against the threshold decides whether it answers or
// forwards to the center; a request naming the center's model goes there at once. Both count
// who answered in loom_cascade_requests_total.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "loom/core/error.h"
#include "loom/serve/cascade/edge.h"

namespace loom::serve::cascade {

void Edge::count_answer(const std::string& answered_by, const std::string& edge_version,
                        const std::string& center_version, double confidence) {
  metrics_
      ->counter("loom_cascade_requests_total", "cascade requests by who answered and the version pair",
                {{"answered_by", answered_by}, {"edge_version", edge_version}, {"center_version", center_version}})
      .inc();
  if (std::isfinite(confidence))
    metrics_
        ->histogram("loom_cascade_confidence", "the edge's confidence in its first window of tokens",
                    {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0})
        .observe(confidence);
}

bool Edge::forward_to_center(net::HttpExchange& ex, const std::string& why, const std::string& edge_version,
                             double confidence, const std::function<void()>& taken, std::string* failure) {
  net::HeaderList headers = {{"X-Loom-Forwarded-Because", why}};
  if (!edge_version.empty()) headers.emplace_back("X-Loom-Edge-Version", edge_version);
  if (std::isfinite(confidence)) headers.emplace_back("X-Loom-Confidence", str_cat(confidence));
  ForwardResult r = forward(ex, headers, taken, [&](const std::string& center_version) {
    count_answer("center", edge_version, center_version, confidence);
    ex.note(str_cat("forwarded=", why));
  });
  if (r.outcome == Forwarded::unreachable) {
    std::fprintf(stderr, "[serve] cascade: the center cannot take a request: %s\n", r.why.c_str());
    *failure = r.why;
    return false;
  }
  return true;
}

bool Edge::route_model(net::HttpExchange& ex, const std::string& model, const std::string& edge_version) {
  if (model.empty() || !center_serves(model)) return false;
  std::string failure;
  if (!forward_to_center(ex, "model", edge_version, std::numeric_limits<double>::quiet_NaN(), {}, &failure))
    ex.respond(error_response(error_for_status(
        503, str_cat("the model '", model, "' is served by the center, which cannot be reached: ", failure))));
  return true;
}

EdgeHook::Verdict Edge::decide(net::HttpExchange& ex, std::span<const double> probs, bool may_forward,
                               const std::string& edge_version, const std::function<void()>& stop_local,
                               net::HeaderList* headers) {
  double sum = 0, least = 1;
  for (double p : probs) {
    sum += p;
    least = std::min(least, p);
  }
  const double confidence = probs.empty() ? 1.0 : sum / double(probs.size());
  if (confidence < opt_.threshold && may_forward) {
    std::string failure;
    if (forward_to_center(ex, "confidence", edge_version, confidence, stop_local, &failure))
      return Verdict::answered_elsewhere;
    if (!opt_.local_when_center_down) {
      stop_local();
      ex.respond(error_response(
          error_for_status(503, str_cat("the edge is not confident enough (", confidence, " < ", opt_.threshold,
                                        ") and the center cannot be reached: ", failure))));
      return Verdict::answered_elsewhere;
    }
    headers->emplace_back("X-Loom-Cascade", "center-unreachable");
  }
  count_answer("edge", edge_version, center_version(), confidence);
  headers->emplace_back("X-Loom-Confidence", str_cat(confidence));
  headers->emplace_back("X-Loom-Confidence-Min", str_cat(least));
  return Verdict::answer_here;
}

}  // namespace loom::serve::cascade
