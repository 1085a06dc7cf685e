// A small HTTP/1.1 server over POSIX sockets: one acceptor thread and one thread per
// connection (bounded; when full, the connection waiting longest for a request head makes
// room, so slow clients cannot lock others out), keep-alive, limits on head and body size,
// chunked streaming responses that notice when the client has gone, an access log. Knows
// nothing of OpenAI or engines.
#pragma once
#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "loom/net/http.h"

namespace loom::net {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: the kernel picks a free port (see HttpServer::port())
  HttpLimits limits;
  int max_connections = 1024;
  double idle_timeout_s = 60;   // keep-alive connection with no new request
  double read_timeout_s = 30;   // a started request must arrive completely within this
  double write_timeout_s = 30;  // a client that stops reading for this long is dropped
  // One line per answered request on stderr: method, path, status, latency and, when the
  // handler noted them, tokens.
  bool access_log = true;
};

class Connection;

// One request and its response. A handler either calls respond() once, or start_stream(),
// send_chunk()... and end_stream().
class HttpExchange {
 public:
  HttpExchange(Connection& conn, HttpRequest req) : conn_(conn), req_(std::move(req)) {}
  const HttpRequest& request() const { return req_; }

  void respond(const HttpResponse& r);
  // Sends the head of a chunked response. Returns false when the client is gone.
  bool start_stream(int status, std::string_view content_type, const HeaderList& extra = {});
  bool send_chunk(std::string_view data);  // false: the client is gone (or stopped reading)
  void end_stream();
  // Non-blocking: has the peer closed or reset the connection?
  bool client_gone();
  // Gives up on a client that went away before any response: nothing more is sent, the
  // connection closes, and status() reads 499 (nginx's "client closed request").
  void abandon();

  // Runs `fn(status)` once, just before the response's last bytes go out (respond(), or
  // end_stream()), or at finish() for an exchange that ended otherwise: what a client sees
  // after its response (e.g. /metrics) already counts this request.
  void on_finish(std::function<void(int status)> fn) { on_finish_ = std::move(fn); }
  void finish();  // runs the on_finish hook if it has not run (idempotent)

  // What the access log line adds for this request (e.g. "tokens=12+40").
  void note(std::string text) { note_ = std::move(text); }
  const std::string& noted() const { return note_; }

  bool responded() const { return state_ != State::fresh; }
  bool streaming() const { return state_ == State::streaming; }
  int status() const { return status_; }
  bool keeps_connection() const;

 private:
  enum class State { fresh, streaming, done, broken };
  Connection& conn_;
  HttpRequest req_;
  State state_ = State::fresh;
  int status_ = 0;
  bool close_ = false;
  bool chunked_ = true;  // HTTP/1.0 clients get a close-delimited stream instead
  std::string note_;
  std::function<void(int)> on_finish_;
};

class HttpServer {
 public:
  using Handler = std::function<void(HttpExchange&)>;
  // Builds the response for a request refused before any handler ran (bad head, 413, ...).
  using ErrorRenderer = std::function<HttpResponse(int status, const std::string& message)>;

  HttpServer(HttpServerOptions opt, Handler handler, ErrorRenderer render_error = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts accepting. Throws loom::Error naming the address on failure.
  void start();
  int port() const { return port_; }
  // The start of a shutdown: no new connections, but those already in the listen backlog are
  // accepted and served (closing a listening socket resets the connections queued on it);
  // from now on every response closes its connection. Existing connections keep being served.
  void stop_accepting();
  // Stops accepting, then lets every connection end by itself within a bounded drain time:
  // a handler running finishes its response, a request arriving is answered, an idle
  // connection is closed. Whatever is left then is shut down; all threads are joined.
  // Idempotent.
  void stop();
  int64_t open_connections() const { return open_.load(); }
  // Connections closed to admit a new one while the server was full (see serve_connection).
  int64_t evicted_connections() const { return evicted_.load(); }

  // Used by connections.
  const HttpServerOptions& options() const { return opt_; }
  void handle(HttpExchange& ex);
  HttpResponse render_error(int status, const std::string& message) const;
  bool draining() const { return draining_.load(); }
  std::string next_error_id();              // for a 500's log line and body
  int stop_fd() const { return stop_fd_; }  // readable once stop() has begun

 private:
  struct Slot;
  void accept_loop();
  void serve_connection(int fd);
  bool evict_oldest_waiting();
  void reap(bool all);

  HttpServerOptions opt_;
  Handler handler_;
  ErrorRenderer render_error_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that interrupts the acceptor's poll
  int stop_fd_ = -1;  // eventfd, readable from stop() on: wakes idle connections
  int port_ = 0;
  std::thread acceptor_;
  std::atomic<bool> accepting_{false}, draining_{false}, stopped_{false};
  std::atomic<int64_t> open_{0}, evicted_{0}, errors_{0};
  std::mutex mu_;
  std::list<std::unique_ptr<Slot>> slots_;
};

}  // namespace loom::net
