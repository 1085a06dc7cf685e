// Engine, tensor parallel: the leader (rank 0) broadcasts each step's intake and aborts, and
// whether it closes, so that every rank schedules the same; the followers step until released.
#include <cstring>

#include "loom/core/error.h"
#include "loom/infer/engine.h"
#include "loom/infer/wire.h"

namespace loom::infer {

void Engine::follow() {
  LOOM_CHECK(!leader(), "engine", "follow() is for the ranks other than 0 of a tensor-parallel engine");
  while (!closed_) step();
}

void Engine::close() {
  if (!tp_ || closed_ || !leader()) return;
  std::vector<Pending> none;
  std::vector<int64_t> no_aborts;
  sync_intake(none, no_aborts, /*closing=*/true);
}

void Engine::share_from_leader(std::vector<uint8_t>& bytes) const {
  Tensor head = Tensor::empty({1}, DType::i64, MemCategory::comm);
  if (leader()) head.data<int64_t>()[0] = int64_t(bytes.size());
  tp_->broadcast(head, 0);
  Tensor body = Tensor::empty({head.data<int64_t>()[0]}, DType::u8, MemCategory::comm);
  if (leader()) std::memcpy(body.raw(), bytes.data(), bytes.size());
  tp_->broadcast(body, 0);
  if (!leader())
    bytes.assign(static_cast<const uint8_t*>(body.raw()), static_cast<const uint8_t*>(body.raw()) + body.numel());
}

bool Engine::sync_intake(std::vector<Pending>& intake, std::vector<int64_t>& aborts, bool closing) {
  ByteWriter w;
  if (leader()) {
    w.put(uint8_t(closing));
    w.put(int64_t(intake.size()));
    for (const Pending& p : intake) {
      const Request& r = p.req;
      w.put(p.id);
      w.put(r.seed);
      w.put(r.max_tokens);
      w.put(r.spec_k);
      w.put_vec(r.prompt);
      write_sampling_params(w, r.params);
    }
    w.put_vec(aborts);
  }
  share_from_leader(w.bytes());
  ByteReader rd(w.bytes());
  closing = rd.get<uint8_t>() != 0;
  if (!leader()) {
    const int64_t n = rd.get<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      Pending p;
      Request& r = p.req;
      p.id = rd.get<int64_t>();
      r.seed = rd.get<uint64_t>();
      r.max_tokens = rd.get<int64_t>();
      r.spec_k = rd.get<int64_t>();
      r.prompt = rd.get_vec<int32_t>();
      r.params = read_sampling_params(rd);
      intake.push_back(std::move(p));
      ++in_flight_;
    }
    aborts = rd.get_vec<int64_t>();
  }
  if (closing) closed_ = true;
  return !closed_;
}

}  // namespace loom::infer
