// Ranks agreeing about checkpoints: a save or load fails on every rank when it fails on one (so
// none goes on into collectives its peers never reach), and a resume's search picks the same
// checkpoint everywhere. Used by checkpoint_save.cpp, checkpoint_load.cpp and the trainer.
#pragma once
#include <exception>
#include <string>

#include "loom/comm/group.h"
#include "loom/train/checkpoint.h"

namespace loom::train {

// The lowest rank of g where `ok` is false, or -1 when it holds everywhere (collective).
int first_failing_rank(const comm::Group& g, bool ok);

// Runs `f` on every rank; if it throws on any, every rank throws (throw_unless_ok_everywhere).
template <class F>
void on_every_rank_or_none(const comm::Group& g, const std::string& what, F&& f, const std::string& fix = "") {
  std::string why;
  bool ok = true;
  try {
    f();
  } catch (const std::exception& e) {
    ok = false;
    why = e.what();
  }
  throw_unless_ok_everywhere(g, ok, why, what, fix);
}

}  // namespace loom::train
