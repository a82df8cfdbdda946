// Epoch-based reclamation for the dispatch table.
//
// Readers (every trampoline call) mark themselves active with two plain
// thread-local stores; they never take a lock or a shared refcount. A
// writer that retired something waits in synchronize() until every call
// that could still see it has finished. The readers' ordering comes from
// the writer's side: membarrier(PRIVATE_EXPEDITED) makes every running
// thread execute a full barrier, so readers need no fence of their own.
// Where membarrier is unavailable, readers fall back to a seq_cst fence.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/thread_state.h"

namespace maxdev::dispatch {

// One cache line each: every call writes its thread's record, and two
// threads' records sharing a line would bounce it between cores.
struct alignas(64) ReaderRecord {
  std::atomic<uint64_t> epoch{0};  // 0: quiescent; else the epoch seen on entry
  uint32_t depth = 0;              // nesting (a kernel may call back into PyTorch)
  std::atomic<bool> in_use{false};
};

namespace epoch_detail {
extern std::atomic<uint64_t> global_epoch;
extern bool readers_need_fence;
ReaderRecord& register_reader();
}  // namespace epoch_detail

inline ReaderRecord& reader_record() {
  ReaderRecord* r = thread_state.reader_record;
  return r != nullptr ? *r : epoch_detail::register_reader();
}

// RAII marker of a read-side critical section.
class ReadGuard {
 public:
  ReadGuard() : record_(reader_record()) {
    if (record_.depth++ == 0) {
      record_.epoch.store(epoch_detail::global_epoch.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
      if (epoch_detail::readers_need_fence) {
        std::atomic_thread_fence(std::memory_order_seq_cst);
      } else {
        std::atomic_signal_fence(std::memory_order_seq_cst);
      }
    }
  }
  ~ReadGuard() {
    if (--record_.depth == 0) record_.epoch.store(0, std::memory_order_release);
  }
  ReadGuard(const ReadGuard&) = delete;
  ReadGuard& operator=(const ReadGuard&) = delete;

 private:
  ReaderRecord& record_;
};

// Waits until no reader can still hold anything unpublished before the
// call. Must not be called from inside a ReadGuard (it would wait for
// itself): throws std::logic_error instead.
void synchronize();

// Whether the calling thread is inside a kernel call.
inline bool inside_read_section() { return reader_record().depth > 0; }

}  // namespace maxdev::dispatch
