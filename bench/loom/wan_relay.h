// A TCP relay that emulates a WAN link (one-way delay, a rate shared per direction) between an
// edge and a center server for `loom bench cascade`, because our kernels lack tc's netem qdisc.
// Not a general proxy: one fixed target, no TLS, at most kMaxConnections, 16 KiB timing grain.
#pragma once
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace loom::bench {

struct WanLinkOptions {
  double delay_s = 0.040;  // one-way propagation delay, each direction
  double rate_bps = 20e6;  // bits per second in each direction, shared by all connections (0: unlimited)
};

// Model, per direction of the link: a chunk of n bytes read at t starts transmission at
// max(t, end of the previous chunk on that direction, any connection), takes n*8/rate_bps, and
// is written delay_s after its transmission ends. A connection's first bytes (either way) are
// held until its handshake round trip (2*delay_s after accept) is over. EOF travels like data.
// Backpressure: a connection stops reading a direction while kMaxQueuedBytes of it are unsent,
// and every connection stops reading while the link's transmission backlog exceeds
// kMaxBacklogS (a router's queue), so the senders' TCP windows slow them down instead.
class WanRelay {
 public:
  static constexpr int kMaxConnections = 256;         // more are closed on accept
  static constexpr size_t kChunkBytes = 16 * 1024;    // read size: the shaping grain
  static constexpr size_t kMaxQueuedBytes = 4 << 20;  // per direction of a connection
  static constexpr double kMaxBacklogS = 0.1;         // per direction of the link

  // Listens on listen_host:listen_port (0: a free port) and relays every accepted connection to
  // target_host:target_port through the emulated link. Throws loom::Error on bad options.
  WanRelay(std::string listen_host, int listen_port, std::string target_host, int target_port, WanLinkOptions link);
  ~WanRelay();  // stop()
  WanRelay(const WanRelay&) = delete;
  WanRelay& operator=(const WanRelay&) = delete;

  void start();      // resolves the target, binds and listens, starts accepting; throws loom::Error
  int port() const;  // the bound port (after start())
  void stop();       // closes the listener and every relayed connection within ~0.1 s; idempotent

  struct Stats {
    int64_t connections = 0;               // accepted (not refused), reachable target or not
    int64_t refused = 0;                   // closed on accept: kMaxConnections reached
    int64_t bytes_up = 0, bytes_down = 0;  // delivered; up: client -> target
    int64_t read_up = 0, read_down = 0;    // read from the sender; minus delivered: queued here
  };
  Stats stats() const;
  // Changes delay and rate for data read from now on (thread-safe). Order within a connection
  // is kept, so a smaller delay takes effect once the data read before it has left.
  void set_link(WanLinkOptions link);
  WanLinkOptions link() const;

  using Addresses = std::vector<std::pair<sockaddr_storage, socklen_t>>;  // resolved host:port

 private:
  using Clock = std::chrono::steady_clock;
  struct Connection;
  struct LinkDirection {  // the transmission schedule of one direction, shared by connections
    std::mutex mu;
    Clock::time_point free_at{};  // when the last reserved chunk finishes transmission
  };

  void accept_loop();
  void reap_finished();  // joins connections whose threads are done; caller holds conns_mu_
  void run_connection(Connection& c);
  int connect_target();               // a connected non-blocking socket, or -1 (refused, timeout, stop)
  void pump(Connection& c, bool up);  // relays one direction until EOF was delivered or failure

  const std::string listen_host_, target_host_;
  const int listen_port_, target_port_;
  Addresses target_addrs_;  // set by start()

  mutable std::mutex link_mu_;
  WanLinkOptions link_;
  LinkDirection up_, down_;

  std::mutex lifecycle_mu_;  // serialises start() and stop()
  int listen_fd_ = -1;
  std::atomic<int> port_{0};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;

  std::mutex conns_mu_;  // guards conns_ and the descriptors in each Connection
  std::list<std::unique_ptr<Connection>> conns_;
  std::atomic<int64_t> connections_{0}, refused_{0}, bytes_up_{0}, bytes_down_{0}, read_up_{0}, read_down_{0};
};

}  // namespace loom::bench
