// One accepted connection of the HTTP server (http_server.h): reads request heads and bodies,
// runs the handler, writes responses and ends with a lingering close. Private to net.
#pragma once
#include <atomic>
#include <string>
#include <string_view>

#include "loom/net/http_server.h"

namespace loom::net {

class Connection {
 public:
  // waiting_since: set to the time the connection starts waiting for a request head (its
  // first, or the next on a kept-alive connection), 0 once the head is complete; the server
  // sets -1 when it evicts the connection (HttpServer::evict_oldest_waiting).
  Connection(HttpServer& server, int fd, std::atomic<double>& waiting_since)
      : server_(server), fd_(fd), waiting_since_(waiting_since) {}
  void run();
  bool send_all(std::string_view data);
  bool peer_gone();
  // Ends our side and reads until the client closes (or kLingerS passes; a connection that
  // run() left idle at stop: until all sent is acknowledged) before the caller closes it.
  void linger();
  // A draining server closes every connection after its response.
  bool closing() const { return server_.draining(); }

 private:
  // stopping: stop() has begun and the connection is idle (no request under way).
  enum class Read { data, eof, timeout, stopping };
  Read read_more(double deadline, bool idle);
  void refuse(int status, const std::string& message);
  bool unacknowledged_output();  // sent bytes the client has not acknowledged yet

  void log_access(const HttpExchange& ex, double started) const;

  HttpServer& server_;
  int fd_;
  std::atomic<double>& waiting_since_;
  std::string buf_;
  bool stop_seen_ = false;
  double stop_deadline_ = 0;
  bool idle_at_stop_ = false;  // run() ended because stop() found the connection idle
};

}  // namespace loom::net
