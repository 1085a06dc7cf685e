// The exit statuses of every loom command, in one place: what a script or a launcher may
// branch on. docs/TROUBLESHOOTING.md lists them for users.
#pragma once

namespace loom {

inline constexpr int kExitOk = 0;
// An error (the message on stderr names the thing and the fix), a crash, or a failed check.
inline constexpr int kExitError = 1;
// The command line was wrong (`loom <command> --help` says what is accepted).
inline constexpr int kExitUsage = 2;
// `loom train` stopped a diverging run (guard.divergence=stop: the smoothed loss stayed far above
// its minimum, or too many steps in a row were non-finite). Restarting would diverge again.
inline constexpr int kExitDiverged = 3;
// The collective watchdog ended a job whose collective did not complete (as `timeout` uses).
inline constexpr int kExitHang = 124;

}  // namespace loom
