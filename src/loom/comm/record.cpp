// The bounded operation log behind step traces and the watchdog.
#include "loom/comm/record.h"

#include "loom/core/enum_names.h"
#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/core/trace.h"

namespace loom::comm {

const char* op_state_name(OpState s) {
  static constexpr EnumName<OpState> kNames[] = {
      {OpState::in_flight, "in_flight"}, {OpState::completed, "completed"}, {OpState::failed, "failed"}};
  return enum_name(kNames, s);
}

std::string op_label(const std::string& op, uint64_t seq) { return str_cat(op, " #", seq); }

uint64_t CommRecord::start(const std::string& op, const std::string& group, int64_t bytes, uint64_t seq,
                           uint64_t group_key) {
  CommEvent e{op, group, bytes, seq, now_seconds(), 0.0, OpState::in_flight, group_key};
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t h = next_handle_++;
  running_.emplace(h, std::move(e));
  return h;
}

void CommRecord::finish(uint64_t handle, bool ok) {
  double t = now_seconds();
  const bool tracing = trace::enabled();
  CommEvent traced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(handle);
    if (it == running_.end()) return;
    CommEvent e = std::move(it->second);
    running_.erase(it);
    e.t_end = t;
    e.state = ok ? OpState::completed : OpState::failed;
    if (ok) last_ok_[e.group] = e;
    if (tracing) traced = e;
    done_.push_back(std::move(e));
    while (done_.size() > capacity_) done_.pop_front();
  }
  // Step traces show it on the group's own track: the group's worker thread runs it while
  // the caller goes on.
  if (tracing)
    trace::record_on_track("comm " + traced.group, traced.op, "comm", traced.t_start, traced.t_end,
                           {{"bytes", traced.bytes}, {"seq", int64_t(traced.seq)}, {"ok", ok ? 1 : 0}});
}

std::vector<CommEvent> CommRecord::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CommEvent> out;
  out.reserve(running_.size());
  for (const auto& [h, e] : running_) out.push_back(e);
  return out;
}

std::vector<CommEvent> CommRecord::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {done_.begin(), done_.end()};
}

std::optional<CommEvent> CommRecord::last_completed(const std::string& group) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = last_ok_.find(group);
  if (it == last_ok_.end()) return std::nullopt;
  return it->second;
}

uint64_t CommRecord::total_started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_handle_ - 1;
}

}  // namespace loom::comm
