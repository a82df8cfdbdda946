#include "dispatch/epoch.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace maxdev::dispatch {
namespace epoch_detail {
namespace {

bool membarrier(int cmd) { return ::syscall(__NR_membarrier, cmd, 0, 0) == 0; }

bool setup_membarrier() {
  const long supported = ::syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  return supported > 0 && (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
         membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
}

std::mutex records_mutex;
// Never shrinks (records are reused) and never destroyed: threads that
// outlive static destruction (PyTorch's autograd workers) still give their
// record back when they exit.
std::deque<ReaderRecord>& records = *new std::deque<ReaderRecord>;

// Gives the record back when its thread exits.
struct RecordReleaser {
  ~RecordReleaser() {
    ReaderRecord* record = thread_state.reader_record;
    if (record != nullptr) record->in_use.store(false, std::memory_order_release);
  }
};
thread_local RecordReleaser releaser;

// A forked child has only the thread that forked: every other thread's
// record (one may have been inside a kernel call) would make the child's
// first synchronize() wait forever. The child starts with them free.
void forget_other_threads() {
  new (&records_mutex) std::mutex;  // whoever held it does not exist here
  for (auto& r : records) {
    if (&r == thread_state.reader_record) continue;
    r.epoch.store(0, std::memory_order_relaxed);
    r.depth = 0;
    r.in_use.store(false, std::memory_order_relaxed);
  }
}
[[maybe_unused]] const int fork_handler = ::pthread_atfork(nullptr, nullptr, &forget_other_threads);

}  // namespace

std::atomic<uint64_t> global_epoch{1};
bool readers_need_fence = !setup_membarrier();

ReaderRecord& register_reader() {
  (void)releaser;  // instantiate the thread's releaser
  std::lock_guard lock(records_mutex);
  for (auto& r : records) {
    bool expected = false;
    if (r.in_use.compare_exchange_strong(expected, true)) return *(thread_state.reader_record = &r);
  }
  records.emplace_back().in_use = true;
  return *(thread_state.reader_record = &records.back());
}

}  // namespace epoch_detail

void synchronize() {
  using namespace epoch_detail;
  if (inside_read_section()) {
    throw std::logic_error(
        "max_device: cannot change loaded plugins from inside a kernel call on this thread");
  }
  const uint64_t target = global_epoch.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (!readers_need_fence) ::syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::lock_guard lock(records_mutex);
  for (auto& r : records) {
    for (int spins = 0;; ++spins) {
      const uint64_t seen = r.epoch.load(std::memory_order_acquire);
      if (seen == 0 || seen >= target) break;
      if (spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
}

}  // namespace maxdev::dispatch
