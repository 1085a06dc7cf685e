// What the API server asks of an edge of an edge/center cascade (serve/cascade implements it,
// docs/CASCADE.md): how many tokens to generate before deciding, the confidence threshold, and
// how to hand a request to the center. The server keeps the decision itself (generation.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "loom/serve/http_server.h"

namespace loom::serve {

class EdgeHook {
 public:
  virtual ~EdgeHook() = default;
  // Tokens the edge generates (and holds back) before it decides; a shorter answer decides at
  // its end. The confidence is the mean probability of these tokens under the edge's model.
  virtual int64_t window_tokens() const = 0;
  // The edge answers at or above this confidence (in [0, 1]) and forwards below it.
  virtual double threshold() const = 0;
  // A request names `model`, which this server does not serve: true when the center does.
  virtual bool center_serves(const std::string& model) const = 0;

  enum class Forwarded { done, unreachable };
  struct ForwardResult {
    Forwarded outcome = Forwarded::unreachable;
    std::string why;             // unreachable: what failed, for the log and a 503
    std::string center_version;  // done: the version that answered (its X-Loom-Model-Version)
  };
  // Sends ex's request to the center and relays the center's answer on ex, adding `headers`.
  // `taken` runs once the center has the request (the edge then stops its own generation).
  // unreachable: nothing was written on ex.
  virtual ForwardResult forward(HttpExchange& ex, const HeaderList& headers, const std::function<void()>& taken) = 0;
  // When the center cannot take a request: true answers with the edge's own tokens (and says
  // so in X-Loom-Cascade), false answers 503.
  virtual bool answer_locally_when_center_down() const = 0;
  // The center's version as last seen (for the metrics of requests the edge answers).
  virtual std::string center_version() const = 0;
};

}  // namespace loom::serve
