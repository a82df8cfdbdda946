#include "device/allocator.h"

#include <c10/util/Exception.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace maxdev::device {
namespace {

// Every block carries its size and device in a 64-byte header so release()
// can keep the statistics exact without a side table.
struct alignas(kAlignment) BlockHeader {
  void* malloc_block;  // what malloc returned, for free()
  size_t nbytes;
  c10::DeviceIndex device;
};
static_assert(sizeof(BlockHeader) == kAlignment);

// malloc's alignment, of which the data's 64 bytes ask at most this much more.
constexpr size_t kMallocAlignment = alignof(std::max_align_t);
constexpr size_t kAlignmentSlack = kAlignment - kMallocAlignment;

struct Counters {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> frees{0};
  std::atomic<int64_t> bytes_allocated_total{0};
  std::atomic<int64_t> bytes_freed_total{0};
};
std::array<Counters, kMaxDevices> counters_by_device;

Counters& counters_of(c10::DeviceIndex device) { return counters_by_device[resolve_device_index(device)]; }

void count_allocation(Counters& counters, int64_t nbytes) {
  counters.bytes_allocated_total.fetch_add(nbytes, std::memory_order_relaxed);
  const int64_t now = counters.allocated.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  int64_t peak = counters.peak.load(std::memory_order_relaxed);
  while (now > peak && !counters.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void count_release(Counters& counters, int64_t nbytes) {
  counters.allocated.fetch_sub(nbytes, std::memory_order_relaxed);
  counters.bytes_freed_total.fetch_add(nbytes, std::memory_order_relaxed);
}

c10::DeviceIndex count_from_environment() {
  const char* value = std::getenv("MAX_DEVICE_COUNT");
  if (value == nullptr || *value == '\0') return kDefaultDeviceCount;
  char* end = nullptr;
  const long count = std::strtol(value, &end, 10);
  // The Python package refuses a bad value at import with a clear error;
  // here it only must not take effect.
  if (*end != '\0' || count < 1 || count > kMaxDevices) return kDefaultDeviceCount;
  return static_cast<c10::DeviceIndex>(count);
}

}  // namespace

c10::DeviceIndex device_count() {
  static const c10::DeviceIndex count = count_from_environment();
  return count;
}

c10::DeviceIndex current_device_index() { return thread_state.current_device; }

void set_current_device_index(c10::DeviceIndex index) {
  // Device guards set the device they found again on the way out, twice per op.
  if (index == thread_state.current_device) return;
  check_device_index(index);
  if (index >= 0) thread_state.current_device = index;
}

c10::Device current_device() { return c10::Device(kDeviceType, thread_state.current_device); }

void check_device_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= -1 && index < device_count(), "max_device:", static_cast<int>(index),
              " does not exist: invalid device ordinal (max_device has ", static_cast<int>(device_count()),
              " devices, max_device:0 to max_device:", static_cast<int>(device_count() - 1),
              "; MAX_DEVICE_COUNT sets how many)");
}

c10::DeviceIndex resolve_device_index(c10::DeviceIndex index) {
  check_device_index(index);
  return index == -1 ? thread_state.current_device : index;
}

c10::DataPtr HostAllocator::allocate(size_t nbytes) {
  const c10::DeviceIndex device = thread_state.current_device;
  const c10::Device tag = device_side_ ? c10::Device(kDeviceType, device) : c10::Device(c10::kCPU);
  if (nbytes == 0) return c10::DataPtr(nullptr, tag);
  const size_t padded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  // malloc and aligning by hand, not aligned_alloc: glibc's memalign path
  // costs ~750 instructions per small block, its thread cache ~100.
  void* block = std::malloc(sizeof(BlockHeader) + kAlignmentSlack + padded);
  TORCH_CHECK_WITH(OutOfMemoryError, block != nullptr, "max_device: out of host memory allocating ",
                   nbytes, " bytes");
  const uintptr_t first = reinterpret_cast<uintptr_t>(block) + sizeof(BlockHeader);
  void* data = reinterpret_cast<void*>((first + kAlignment - 1) & ~(uintptr_t{kAlignment} - 1));
  static_cast<BlockHeader*>(data)[-1] = BlockHeader{block, nbytes, device};
  // The thread's current device and a header's are valid indexes already.
  Counters& counters = counters_by_device[device];
  count_allocation(counters, static_cast<int64_t>(nbytes));
  counters.allocations.fetch_add(1, std::memory_order_relaxed);
  return {data, data, &release, tag};
}

void HostAllocator::release(void* ptr) {
  if (ptr == nullptr) return;
  auto* header = static_cast<BlockHeader*>(ptr) - 1;
  Counters& counters = counters_by_device[header->device];
  count_release(counters, static_cast<int64_t>(header->nbytes));
  counters.frees.fetch_add(1, std::memory_order_relaxed);
  std::free(header->malloc_block);
}

void HostAllocator::note_adopted(c10::DeviceIndex device, int64_t nbytes) {
  count_allocation(counters_of(device), nbytes);
}

void HostAllocator::note_adopted_release(c10::DeviceIndex device, int64_t nbytes) {
  count_release(counters_of(device), nbytes);
}

void HostAllocator::copy_data(void* dest, const void* src, size_t count) const {
  std::memcpy(dest, src, count);
}

MemoryStats HostAllocator::stats(c10::DeviceIndex device) const {
  const Counters& counters = counters_of(device);
  return {counters.allocated.load(), counters.peak.load(), counters.allocations.load(),
          counters.frees.load()};
}

void HostAllocator::reset_peak(c10::DeviceIndex device) {
  Counters& counters = counters_of(device);
  counters.peak.store(counters.allocated.load());
}

void HostAllocator::reset_accumulated(c10::DeviceIndex device) {
  Counters& counters = counters_of(device);
  counters.allocations.store(0);
  counters.frees.store(0);
  counters.bytes_allocated_total.store(0);
  counters.bytes_freed_total.store(0);
}

c10::CachingDeviceAllocator::DeviceStats HostAllocator::getDeviceStats(c10::DeviceIndex device) {
  const Counters& counters = counters_of(device);
  c10::CachingDeviceAllocator::DeviceStats out;
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const int64_t live_bytes = counters.allocated.load();
  const int64_t allocations = counters.allocations.load();
  const int64_t frees = counters.frees.load();
  c10::CachingAllocator::Stat bytes;
  bytes.current = live_bytes;
  bytes.peak = counters.peak.load();
  bytes.allocated = counters.bytes_allocated_total.load();
  bytes.freed = counters.bytes_freed_total.load();
  c10::CachingAllocator::Stat blocks;
  blocks.current = allocations - frees;
  blocks.peak = blocks.current;
  blocks.allocated = allocations;
  blocks.freed = frees;
  // No cache: every allocated byte is reserved, active and requested.
  for (auto* stat : {&out.allocated_bytes, &out.reserved_bytes, &out.active_bytes, &out.requested_bytes}) {
    (*stat)[aggregate] = bytes;
  }
  for (auto* stat : {&out.allocation, &out.segment, &out.active}) (*stat)[aggregate] = blocks;
  out.num_device_alloc = allocations;
  out.num_device_free = frees;
  return out;
}

void HostAllocator::resetAccumulatedStats(c10::DeviceIndex device) { reset_accumulated(device); }

void HostAllocator::resetPeakStats(c10::DeviceIndex device) { reset_peak(device); }

std::pair<size_t, size_t> HostAllocator::getMemoryInfo(c10::DeviceIndex device) {
  check_device_index(device);
  struct sysinfo info{};
  TORCH_CHECK(sysinfo(&info) == 0, "max_device: sysinfo() failed: ", std::strerror(errno));
  return {static_cast<size_t>(info.freeram) * info.mem_unit, static_cast<size_t>(info.totalram) * info.mem_unit};
}

void check_allocated(const c10::TensorImpl& impl, const void* data) {
  TORCH_CHECK(data != nullptr || impl.numel() == 0 || impl.is_meta(), "max_device: a tensor of ", impl.numel(),
              " elements has no data allocated yet");
}

HostAllocator& allocator() {
  static HostAllocator instance(/*device_side=*/true);
  return instance;
}

HostAllocator& host_side_allocator() {
  static HostAllocator instance(/*device_side=*/false);
  return instance;
}

namespace {

// Live pinned blocks by start address, so is_pinned() answers for any
// pointer inside one (a storage slice starts past the block's start).
class PinnedBlocks {
 public:
  void add(const void* start, size_t nbytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[reinterpret_cast<uintptr_t>(start)] = nbytes;
  }
  void remove(const void* start) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.erase(reinterpret_cast<uintptr_t>(start));
  }
  bool contains(const void* ptr) const {
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return false;
    --it;
    return address < it->first + it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;
};

PinnedBlocks& pinned_blocks() {
  static auto* blocks = new PinnedBlocks();  // outlives every static tensor
  return *blocks;
}

struct PinnedBlock {
  void* data;
  size_t nbytes;
  bool locked;
};

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    const size_t padded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* data = std::aligned_alloc(kAlignment, padded);
    TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr, "max_device: out of host memory pinning ", nbytes,
                     " bytes");
    auto* block = new PinnedBlock{data, padded, mlock(data, padded) == 0};
    pinned_blocks().add(data, padded);
    return {data, block, &release_block, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, size_t count) const override { std::memcpy(dest, src, count); }

 private:
  static void release_block(void* ctx) {
    auto* block = static_cast<PinnedBlock*>(ctx);
    pinned_blocks().remove(block->data);
    if (block->locked) munlock(block->data, block->nbytes);
    std::free(block->data);
    delete block;
  }
};

}  // namespace

c10::Allocator& pinned_allocator() {
  static PinnedAllocator instance;
  return instance;
}

bool is_pinned(const void* ptr) { return ptr != nullptr && pinned_blocks().contains(ptr); }

namespace {
// Registered at load time of the loader library, before any tensor exists.
const bool registered = [] {
  c10::SetAllocator(kDeviceType, &allocator());
  return true;
}();
}  // namespace

}  // namespace maxdev::device
