// The pure parts of `loom launch --max-restarts` (elastic restarts): reading why an attempt
// failed from mpirun's and the ranks' lines, the arguments a restart runs with, and which
// ranks or hosts the next attempt drops or takes back. tools/loom/launch.cpp runs the loop.
// Library loom_comm_mpi (the part of comm that links MPI; src/CMakeLists.txt).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace loom::comm {

// Why an attempt ended, as far as its output says: the first rank to fail and how.
struct FailureCause {
  int rank = -1;           // -1: not named
  std::string what;        // "exited on signal 9 (Killed)", "exit code 3", or the watchdog's verdict
  bool hang = false;       // the watchdog ended it (a collective did not complete)
  bool permanent = false;  // a configuration or usage error: a restart would fail the same way
  bool diverged = false;   // `loom train` stopped a diverging run: a restart would diverge again
};

// Folds one output line (a rank's text or mpirun's own) into `cause`. Recognises the watchdog's
// "[watchdog] rank R: all_reduce #17 on group ... has not completed after ..." (a hang, which
// wins over what mpirun says of the ranks it then ended), mpirun's "process rank R with PID ...
// exited on signal S (Name)", "MPI_ABORT was invoked on rank R ... errorcode C", and the
// "Process name: [[j,1],R]" / "Exit code: C" pair of a non-zero exit, and srun's "srun: error:
// HOST: task R: Exited with exit code C" (or "...: Killed"). A rank's "error: [config] ...",
// "[launch] ..." or "error: [launch] ..." (a job started in a way it cannot run) or "usage:"
// marks the failure permanent; "error: [train] training
// diverged" or "... stopped on non-finite values" (kExitDiverged's message) marks it diverged too.
void note_failure_line(const std::string& line, FailureCause& cause);

// The arguments of a restarted `train`: `--resume auto` instead of any --resume, and no
// --overwrite-checkpoints (a restart must never delete the run's checkpoints). Other
// subcommands are restarted unchanged. `dp_auto` adds `--set parallel.dp=auto` (fewer ranks).
std::vector<std::string> restart_args(const std::vector<std::string>& args, bool dp_auto);

// The rank count to shrink to when one rank slot keeps failing on a single host: the largest
// proper divisor of nproc that is at least min_nproc (so a data-parallel size dividing the
// global batch still divides it), or -1 when there is none.
int shrink_nproc(int nproc, int min_nproc);

// Hosts and their slots ("h1:2,h2:2"), and the host of each rank under mpirun's by-slot mapping.
struct HostSlots {
  std::string host;
  int slots = 1;
};
std::vector<HostSlots> parse_host_slots(const std::string& hosts);
std::string format_host_slots(const std::vector<HostSlots>& hosts);
// The host rank r runs on ("" when r is outside the slots).
std::string host_of_rank(const std::vector<HostSlots>& hosts, int rank);

}  // namespace loom::comm
