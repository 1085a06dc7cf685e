// World: MPI's lifetime, the process's comm record, progress board and watchdog, and the
// world Group.
#include "loom/comm/world.h"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <random>
#include <thread>

#include "loom/comm/backend.h"
#include "loom/comm/launch.h"
#include "loom/comm/mpi_backend.h"
#include "loom/comm/p2p_collectives.h"
#include "loom/core/timer.h"
#include "loom/core/trace.h"

namespace loom::comm {

void abort_job(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) {
    // MPI_Abort may itself wait on a wedged runtime; make sure the process still ends.
    std::thread([code] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::abort();
}

namespace {

// One board per job, in shared memory per host: rank 0 names it, every rank maps it and
// fills in its slot, and once all have, the name is removed, so nothing is left in /dev/shm
// however the job ends. Plain MPI calls on MPI_COMM_WORLD, before any Group exists.
std::shared_ptr<ProgressBoard> open_progress_board() {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  char name[64] = {};
  if (rank == 0) {
    std::random_device rd;
    std::snprintf(name, sizeof name, "/loom-progress-%ld-%08x%08x", long(getpid()), unsigned(rd()), unsigned(rd()));
  }
  mpi_check(MPI_Bcast(name, int(sizeof name), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  auto board = std::make_shared<ProgressBoard>(map_shared_memory(name, ProgressBoard::bytes_for(size)), size, rank,
                                               ProcessIdentity::self());
  mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  unlink_shared_memory(name);  // every rank: on each host the first one removes it
  return board;
}

// The host id of every world rank: the world rank of the first rank sharing its memory
// (MPI_COMM_TYPE_SHARED), or blocks of $LOOM_COMM_RANKS_PER_HOST ranks.
std::vector<int> host_of_world_ranks() {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> hosts(size_t(size), 0);
  if (const char* v = std::getenv("LOOM_COMM_RANKS_PER_HOST"); v && *v) {
    char* end = nullptr;
    long k = std::strtol(v, &end, 10);
    LOOM_CHECK(end && *end == '\0' && k >= 1, "comm", "LOOM_COMM_RANKS_PER_HOST=\"", v, "\" is not a positive integer");
    for (int r = 0; r < size; ++r) hosts[size_t(r)] = int(r / k);
    return hosts;
  }
  MPI_Comm shared;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared),
            "MPI_Comm_split_type");
  int first = rank;
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, shared), "MPI_Allreduce");
  MPI_Comm_free(&shared);
  mpi_check(MPI_Allgather(&first, 1, MPI_INT, hosts.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  return hosts;
}

// For step traces: this rank's clock against rank 0's (trace::set_clock_offset). Rank 0
// answers kRounds pings of each rank in turn with its time t0; with the ping sent at t1 and
// the answer back at t2, offset = t0 - (t1 + t2) / 2, taken from the shortest round trip
// (its error is at most half of it). Every rank joins when any rank traces, so ranks that
// disagree cannot leave one another waiting. Plain MPI calls on MPI_COMM_WORLD, before any
// Group exists.
void measure_clock_offset() {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int tracing = trace::enabled() ? 1 : 0;
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, &tracing, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  if (!tracing || size < 2) return;
  constexpr int kRounds = 10, kTag = 0;
  if (rank == 0) {
    for (int r = 1; r < size; ++r)
      for (int k = 0; k < kRounds; ++k) {
        char ping = 0;
        mpi_check(MPI_Recv(&ping, 1, MPI_CHAR, r, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
        const double t0 = now_seconds();
        mpi_check(MPI_Send(&t0, 1, MPI_DOUBLE, r, kTag, MPI_COMM_WORLD), "MPI_Send");
      }
    trace::set_clock_offset(0, 0);
    return;
  }
  double best_rtt = std::numeric_limits<double>::infinity(), best_offset = 0;
  for (int k = 0; k < kRounds; ++k) {
    char ping = 0;
    double t0 = 0;
    const double t1 = now_seconds();
    mpi_check(MPI_Send(&ping, 1, MPI_CHAR, 0, kTag, MPI_COMM_WORLD), "MPI_Send");
    mpi_check(MPI_Recv(&t0, 1, MPI_DOUBLE, 0, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
    const double t2 = now_seconds();
    if (t2 - t1 < best_rtt) {
      best_rtt = t2 - t1;
      best_offset = t0 - (t1 + t2) / 2;
    }
  }
  trace::set_clock_offset(best_offset, best_rtt);
}

std::string option_or_env(const std::string& option, const char* env, const char* fallback) {
  if (!option.empty()) return option;
  const char* v = std::getenv(env);
  return v && *v ? v : fallback;
}

}  // namespace

World::World(int* argc, char*** argv, WorldOptions opts) {
  LaunchEnv env = launch_env();
  if (std::string problem = srun_mpi_problem(env); !problem.empty()) fail("launch", problem);
  bool want_mpi = opts.backend == WorldBackend::mpi || (opts.backend == WorldBackend::auto_detect && env.under_mpi);
  LOOM_CHECK(want_mpi || opts.backend == WorldBackend::single || env.world_size == 1, "comm", env.source,
             " says this is rank ", env.rank, " of ", env.world_size,
             ", but the process was not started by an MPI launcher; start it with "
             "`loom launch --nproc ",
             env.world_size, " -- ...` or mpirun");
  timeout_s_ = opts.watchdog_timeout_s < 0 ? watchdog_timeout_from_env(600) : opts.watchdog_timeout_s;
  record_ = std::make_shared<CommRecord>(opts.record_capacity);
  Algorithm algorithm = parse_algorithm(option_or_env(opts.algorithm, "LOOM_COMM_ALGORITHM", "auto"));
  std::string calibration = option_or_env(opts.calibration, "LOOM_COMM_CALIBRATION", "");
  model_ = std::make_shared<const CostModel>(calibration.empty() ? CostModel{} : load_cost_model(calibration));

  if (want_mpi) {
    int inited = 0;
    MPI_Initialized(&inited);
    LOOM_CHECK(!inited, "comm", "MPI is already initialised; create a single World, in main()");
    int provided = MPI_THREAD_SINGLE;
    mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      fail("comm", "the MPI library provides thread level ", provided, " but loom needs MPI_THREAD_MULTIPLE (",
           int(MPI_THREAD_MULTIPLE),
           ") for its per-group worker threads; use an MPI built with thread support "
           "(Open MPI: --enable-mpi-thread-multiple)");
    }
    mpi_ = true;
    // A launcher that says N ranks while MPI found another number: each rank would train
    // on its own (or wait for peers that never come).
    int mpi_size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    if (env.under_mpi && mpi_size != env.world_size) {
      MPI_Finalize();
      fail(
          "launch", env.source, " says ", env.world_size, " ranks but MPI found ", mpi_size,
          env.under_srun() ? "; start the tasks with srun --mpi=pmix" : "; start the ranks with mpirun or loom launch");
    }
    board_ = open_progress_board();
    measure_clock_offset();
    std::vector<int> hosts = host_of_world_ranks();
    auto world = make_algorithm_backend(make_mpi_world_backend(), hosts, algorithm, model_);
    // Split before the world Group exists, so the world's collective numbers (which the
    // watchdog reports) start at 1 with the caller's first collective.
    auto host = world->split(hosts[size_t(world->rank())], world->rank());
    group_ = make_group(std::move(world), "world", record_, board_);
    host_ = make_group(std::move(host), "host", record_, board_);
  } else {
    group_ = make_group(make_single_backend(), "world", record_);
    host_ = group_;
  }

  WatchdogOptions wd;
  wd.timeout_s = timeout_s_;
  wd.on_timeout = opts.on_timeout;
  wd.board = board_;
  if (!wd.on_timeout) {
    wd.on_timeout = [](const std::string& msg) {
      std::fprintf(stderr, "%s\n", msg.c_str());
      std::fflush(stderr);
      abort_job(kWatchdogExitCode);
    };
  }
  watchdog_ = std::make_unique<Watchdog>(record_, group_.rank(), std::move(wd));
}

World::~World() {
  bool failing = std::uncaught_exceptions() > 0;
  watchdog_.reset();
  host_ = Group();
  group_ = Group();  // joins the world group's worker (or leaves it behind when failing)
  // Finalize synchronises with every peer; a failing rank skips it so mpirun sees the
  // process end without it and tears the job down instead of hanging.
  if (mpi_ && !failing) MPI_Finalize();
}

}  // namespace loom::comm
