// One serving run of `loom bench infer` on its own engine clock (ModeRun): the workload,
// the per-request times, and the results a run reports. Shared by the batching comparison
// (bench_infer.cpp) and the speculative-decoding comparison (bench_spec.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/timer.h"
#include "loom/infer/engine.h"
#include "loom/model/decoder.h"

namespace loom::cli {

using infer::BatchingMode;

// What a static batch does with a member that has finished while others still generate.
//  compact: it leaves at once (the engine's static batching: its blocks are freed, its result
//           returned; nobody joins until the whole batch has left).
//  padded:  the conventional static batch (FasterTransformer, a padded `generate` batch), a
//           baseline this benchmark keeps beside itself rather than in the engine: it admits a
//           batch only when the engine is idle, asks every member for the batch's longest
//           output, counts the tokens past a member's own length as padding rows (computed,
//           then ignored: their K/V fill its cache like a padded row's), and returns all
//           members when the batch ends.
enum class StaticPolicy { compact, padded };
inline const char* static_policy_name(StaticPolicy p) { return p == StaticPolicy::padded ? "padded" : "compact"; }

// One batching policy under test: the mode, the static policy, and its names.
struct Flavour {
  BatchingMode mode = BatchingMode::continuous;
  StaticPolicy policy = StaticPolicy::padded;
  std::string label;  // the table's column
  std::string key;    // the SUMMARY keys' prefix
};

struct WorkItem {
  double arrival = 0;
  std::vector<int32_t> prompt;
  int64_t output_len = 0;
};

struct RequestTimes {
  double arrival = 0, first = -1, last = -1, done = -1;
  int64_t tokens = 0;
};

struct ModeResult {
  std::string mode, key;
  bool is_static = false;
  std::string policy;  // static: padded or compact
  int64_t decode_rows = 0, padding_rows = 0;
  double makespan_s = 0, tokens_per_s = 0, requests_per_s = 0;
  int64_t output_tokens = 0, steps = 0, preemptions = 0;
  std::vector<double> ttft_ms, tpot_ms, e2e_ms;
  int64_t peak_blocks = 0, blocks_total = 0, peak_seqs = 0;
  double frag_at_peak = 0;      // unused slots / allocated slots at peak allocation
  double contiguous_waste = 0;  // what per-request max-length buffers would waste there
  double peak_kv_bytes = 0;
  int64_t spec_proposed = 0, spec_accepted = 0, spec_verifications = 0;  // speculative decoding
};

// One mode's serving run on its own engine clock: the clock advances by the measured wall time
// of each of its steps and jumps to the next arrival when the engine is idle. Latencies are
// what a dedicated machine would show with those step times; and the steps of the two modes can
// be interleaved, so load from other processes on a shared machine falls on both alike.
class ModeRun {
 public:
  ModeRun(const model::Decoder& m, infer::EngineConfig cfg, const Flavour& f, const std::vector<WorkItem>& work,
          double temperature, int64_t max_len)
      : m_(m),
        cfg_(with_flavour(cfg, f)),
        e_(m, cfg_),
        work_(work),
        temperature_(temperature),
        max_len_(max_len),
        times_(work.size()),
        padded_(f.mode == BatchingMode::static_batch && f.policy == StaticPolicy::padded) {
    r_.mode = f.label;
    r_.key = f.key;
    r_.is_static = f.mode == BatchingMode::static_batch;
    if (r_.is_static) r_.policy = static_policy_name(f.policy);
  }
  bool done() const { return finished_ == work_.size(); }
  double clock() const { return clock_; }
  std::string progress() const {
    const auto mt = e_.metrics();
    return str_cat("[", r_.mode, "] t=", int64_t(clock_), "s done ", finished_, "/", work_.size(), " running ",
                   mt.num_running, " waiting ", mt.num_waiting, " kv ", mt.kv_blocks_used, "/", mt.kv_blocks_total);
  }

  // Admits the arrivals due by the clock (padded: a whole batch, when the engine is idle),
  // then runs one step (or idles to the next arrival).
  void advance() {
    if (!padded_) {
      for (; next_ < work_.size() && work_[next_].arrival <= clock_; ++next_) admit(next_, work_[next_].output_len);
    } else if (!e_.has_unfinished()) {
      batch_.clear();
      int64_t longest = 0;
      for (; next_ < work_.size() && work_[next_].arrival <= clock_ && int64_t(batch_.size()) < cfg_.max_num_seqs;
           ++next_) {
        batch_.push_back(next_);
        longest = std::max(longest, work_[next_].output_len);
      }
      batch_ids_.clear();
      for (size_t w : batch_) batch_ids_.push_back(admit(w, longest));
    }
    if (!e_.has_unfinished()) {
      clock_ = std::max(clock_, work_[next_].arrival);
      return;
    }
    stepped_.clear();
    const double t = now_seconds();
    const auto outs = e_.step();
    clock_ += now_seconds() - t;
    for (size_t w : stepped_) {  // tokens are out when their step ends (padding is not streamed)
      if (times_[w].first < 0) times_[w].first = clock_;
      times_[w].last = clock_;
    }
    if (!padded_) {
      for (const auto& out : outs) {
        times_[index_of_[size_t(out.id)]].done = clock_;
        ++finished_;
      }
    } else if (!e_.has_unfinished()) {  // the batch has ended: all its members return now
      for (size_t w : batch_) times_[w].done = clock_;
      finished_ += batch_.size();
    }
    const auto st = e_.scheduler().stats();
    if (st.blocks_used > r_.peak_blocks) {
      r_.peak_blocks = st.blocks_used;
      const double real = double(st.tokens_cached - padding_cached());  // padding holds no real token
      const double alloc = double(st.slots_allocated);
      r_.frag_at_peak = alloc > 0 ? (alloc - real) / alloc : 0;
      const double reserved = double(st.num_running * max_len_);
      r_.contiguous_waste = reserved > 0 ? 1.0 - real / reserved : 0;
    }
    r_.peak_seqs = std::max(r_.peak_seqs, st.num_running);
  }

  ModeResult result() const {
    ModeResult r = r_;
    const auto mt = e_.metrics();
    double end = 0;
    for (const auto& t : times_) {
      end = std::max(end, t.done);
      r.output_tokens += t.tokens;
      r.ttft_ms.push_back((t.first - t.arrival) * 1e3);
      r.e2e_ms.push_back((t.done - t.arrival) * 1e3);
      if (t.tokens > 1) r.tpot_ms.push_back((t.last - t.first) * 1e3 / double(t.tokens - 1));
    }
    r.makespan_s = end - work_.front().arrival;
    r.tokens_per_s = double(r.output_tokens) / r.makespan_s;
    r.requests_per_s = double(work_.size()) / r.makespan_s;
    r.steps = mt.steps;
    r.preemptions = mt.num_preemptions;
    r.decode_rows = mt.decode_rows - padding_rows_;  // each padding token took a decode row
    r.padding_rows = padding_rows_;
    r.spec_proposed = mt.spec_proposed;
    r.spec_accepted = mt.spec_accepted;
    r.spec_verifications = mt.spec_verifications;
    r.blocks_total = mt.kv_blocks_total;
    r.peak_kv_bytes = double(r.peak_blocks) *
                      double(infer::KVCache::bytes_per_block(m_.config(), cfg_.block_size, m_.params().dtype()));
    return r;
  }

 private:
  static infer::EngineConfig with_flavour(infer::EngineConfig c, const Flavour& f) {
    c.mode = f.mode;
    return c;
  }

  // Padded: the cached tokens of the batch past its members' own ends (a member's own are its
  // prompt and its output but the last token, whose K/V nothing reads).
  int64_t padding_cached() const {
    int64_t n = 0;
    for (size_t i = 0; padded_ && i < batch_.size(); ++i) {
      const size_t w = batch_[i];
      const int64_t id = batch_ids_[i];
      if (!e_.scheduler().has(id)) continue;
      const int64_t own = int64_t(work_[w].prompt.size()) + work_[w].output_len - 1;
      n += std::max<int64_t>(0, e_.scheduler().num_computed(id) - own);
    }
    return n;
  }

  // Queues work item w, generating `generate` tokens of which its own output_len count (the
  // rest, under the padded policy, are padding rows).
  int64_t admit(size_t w, int64_t generate) {
    infer::SamplingParams sp;
    sp.temperature = temperature_;
    sp.max_tokens = generate;
    sp.seed = w;
    times_[w].arrival = work_[w].arrival;
    const int64_t id = e_.add_request(work_[w].prompt, sp, [this, w](const infer::TokenEvent& ev) {
      if (ev.token < 0) return;
      if (times_[w].tokens == work_[w].output_len) {
        ++padding_rows_;
        return;
      }
      ++times_[w].tokens;
      stepped_.push_back(w);
    });
    if (index_of_.size() <= size_t(id)) index_of_.resize(size_t(id) + 1);
    index_of_[size_t(id)] = w;
    return id;
  }
  const model::Decoder& m_;
  infer::EngineConfig cfg_;
  infer::Engine e_;
  const std::vector<WorkItem>& work_;
  double temperature_;
  int64_t max_len_;
  std::vector<RequestTimes> times_;
  std::vector<size_t> index_of_;    // engine id -> work index
  std::vector<size_t> stepped_;     // work items that received a token in the current step
  const bool padded_;               // the padded static policy (see StaticPolicy)
  std::vector<size_t> batch_;       // padded: the members of the running batch
  std::vector<int64_t> batch_ids_;  // and their engine ids
  int64_t padding_rows_ = 0;        // padded: tokens generated past their member's length
  size_t next_ = 0, finished_ = 0;
  double clock_ = 0;
  ModeResult r_;
};

// Runs one ModeRun per (config, flavour) side by side, always advancing the one whose clock
// is behind, with a progress line on stderr every 10 s.
inline std::vector<ModeResult> run_side_by_side(const model::Decoder& m, const std::vector<infer::EngineConfig>& cfgs,
                                                const std::vector<Flavour>& flavours, const std::vector<WorkItem>& work,
                                                double temperature, int64_t max_len) {
  std::vector<std::unique_ptr<ModeRun>> runs;
  for (size_t i = 0; i < flavours.size(); ++i)
    runs.push_back(std::make_unique<ModeRun>(m, cfgs[i], flavours[i], work, temperature, max_len));
  double last_report = now_seconds();
  for (;;) {
    ModeRun* behind = nullptr;
    for (auto& r : runs)
      if (!r->done() && (!behind || r->clock() < behind->clock())) behind = r.get();
    if (!behind) break;
    behind->advance();
    if (now_seconds() - last_report > 10.0) {
      last_report = now_seconds();
      std::string line;
      for (auto& r : runs) line += r->progress() + "   ";
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  std::vector<ModeResult> out;
  for (auto& r : runs) out.push_back(r->result());
  return out;
}

}  // namespace loom::cli
