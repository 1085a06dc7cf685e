// World: what main() creates once to take part in a job. It owns MPI's lifetime
// (MPI_Init_thread at MPI_THREAD_MULTIPLE ... MPI_Finalize), the comm record, the progress
// board the ranks of a host share and the watchdog, and hands out the world Group, which
// library code then receives as an argument. Without a launcher (no mpirun environment) it
// is a world of one process without MPI. While a step trace records (core/trace.h), it
// measures this rank's clock against rank 0's when it starts.
// Library loom_comm_mpi (the part of comm that links MPI; src/CMakeLists.txt).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "loom/comm/group.h"
#include "loom/comm/record.h"
#include "loom/comm/watchdog.h"
#include "loom/core/exit_status.h"

namespace loom::comm {

enum class WorldBackend : uint8_t { auto_detect, mpi, single };

struct WorldOptions {
  // auto_detect: MPI when the process was started by an MPI launcher, else single process.
  WorldBackend backend = WorldBackend::auto_detect;
  // < 0: LOOM_COMM_TIMEOUT if set, else 600 s. 0 disables the watchdog. A command with its
  // own setting resolves it with resolve_watchdog_timeout() (watchdog.h) and passes it here.
  double watchdog_timeout_s = -1;
  // Default: print the message and abort the whole job (MPI_Abort; std::abort without MPI).
  std::function<void(const std::string&)> on_timeout;
  size_t record_capacity = 4096;
  // The algorithm of the world's all-reduce, reduce-scatter and all-gather, inherited by every
  // group split from it (algorithm.h). Empty: $LOOM_COMM_ALGORITHM, else "auto".
  std::string algorithm;
  // The cost model `auto` uses: a file from `loom bench comm --calibrate`. Empty:
  // $LOOM_COMM_CALIBRATION, else the built-in defaults.
  std::string calibration;
};

class World {
 public:
  World(int* argc, char*** argv, WorldOptions opts = {});
  explicit World(WorldOptions opts = {}) : World(nullptr, nullptr, std::move(opts)) {}
  // Destroy every Group split from this world before the World. When destroyed by an
  // exception, MPI is not finalized (a peer might never join), so the launcher sees this
  // process fail and tears the job down.
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  const Group& group() const { return group_; }
  // The ranks on this rank's host (node-local communicator), ordered by world rank. Hosts
  // are what MPI reports as sharing memory; $LOOM_COMM_RANKS_PER_HOST=k instead takes ranks
  // [0, k) as one host, [k, 2k) as the next, ... (to exercise topologies on one machine).
  const Group& host() const { return host_; }
  // The cost model the groups' `auto` algorithm uses.
  const CostModel& cost_model() const { return *model_; }
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  bool uses_mpi() const { return mpi_; }
  double watchdog_timeout_s() const { return timeout_s_; }
  const CommRecord& record() const { return *record_; }

 private:
  bool mpi_ = false;
  double timeout_s_ = 0;
  std::shared_ptr<CommRecord> record_;
  std::shared_ptr<ProgressBoard> board_;  // under MPI only
  std::shared_ptr<const CostModel> model_;
  Group group_, host_;
  std::unique_ptr<Watchdog> watchdog_;
};

// The exit status of a job the watchdog ended (core/exit_status.h).
inline constexpr int kWatchdogExitCode = kExitHang;

// Aborts the whole MPI job with `code` when MPI is running, else std::abort(). Only for the
// watchdog and main(); it does not return.
[[noreturn]] void abort_job(int code);

}  // namespace loom::comm
