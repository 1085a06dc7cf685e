// What the API server asks of an edge of an edge/center cascade (serve/cascade implements it,
// docs/CASCADE.md): how many tokens to hold back, and then who answers. The confidence rule,
// the forwarding and the cascade's metrics are the cascade's; the server relays and asks.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "loom/net/http_server.h"

namespace loom::serve {

class EdgeHook {
 public:
  virtual ~EdgeHook() = default;
  // Tokens the edge generates (and holds back) before it decides; a shorter answer decides at
  // its end.
  virtual int64_t window_tokens() const = 0;
  // A request names `model`, which this server does not serve. True: the request has been
  // answered (by the center, or 503 when the center serves the model but cannot be reached);
  // false: the center does not serve it either.
  virtual bool route_model(net::HttpExchange& ex, const std::string& model, const std::string& edge_version) = 0;

  enum class Verdict { answer_here, answered_elsewhere };
  // After the window: `probs` are its tokens' probabilities under the edge's model (the model
  // `edge_version`). may_forward: false once the client is gone or the request was aborted.
  // answered_elsewhere: ex has been answered (the center's reply relayed, or 503), and
  // `stop_local` ran before that; answer_here: the edge answers, adding `headers` to its reply.
  virtual Verdict decide(net::HttpExchange& ex, std::span<const double> probs, bool may_forward,
                         const std::string& edge_version, const std::function<void()>& stop_local,
                         net::HeaderList* headers) = 0;
};

}  // namespace loom::serve
