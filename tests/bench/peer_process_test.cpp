// PeerProcess: the line protocol benchmarks speak to their peers, and what a failure says
// when the peer ends before answering.
#include "bench/loom/peer_process.h"

#include <gtest/gtest.h>

#include "loom/core/error.h"

namespace loom::cli {
namespace {

std::string failure_of(const std::string& script) {
  PeerProcess p({"sh", "-c", script});
  try {
    p.read_line();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no failure)";
}

TEST(PeerProcess, EchoesLinesInOrder) {
  PeerProcess p({"sh", "-c", "echo READY; while read l; do echo \"got $l\"; done"});
  EXPECT_EQ(p.read_line(), "READY");
  p.send_line("a b");
  p.send_line("c");
  EXPECT_EQ(p.read_until("got "), "a b");
  EXPECT_EQ(p.read_line(), "got c");
}

TEST(PeerProcess, NamesTheSignalThatKilledIt) {
  const std::string what = failure_of("kill -SEGV $$");
  EXPECT_NE(what.find("[peer] sh -c"), std::string::npos) << what;
  EXPECT_NE(what.find("was killed by SIGSEGV"), std::string::npos) << what;
}

TEST(PeerProcess, NamesItsExitStatus) {
  const std::string what = failure_of("exit 3");
  EXPECT_NE(what.find("exited with status 3 before answering"), std::string::npos) << what;
}

TEST(PeerProcess, OutputClosedWhileRunning) {
  const std::string what = failure_of("exec >&-; sleep 2");
  EXPECT_NE(what.find("closed its output"), std::string::npos) << what;
}

}  // namespace
}  // namespace loom::cli
