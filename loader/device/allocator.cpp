#include "device/allocator.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

namespace maxdev::device {
namespace {

// Every block carries its size in a 64-byte header so release() can keep
// the statistics exact without a side table.
struct alignas(kAlignment) BlockHeader {
  size_t nbytes;
};
static_assert(sizeof(BlockHeader) == kAlignment);

struct Counters {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> frees{0};
};
Counters counters;

}  // namespace

c10::Device the_device() { return c10::Device(kDeviceType, 0); }

void check_device_index(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(index == -1 || index == 0,
                    "max_device has a single device, max_device:0; got max_device:",
                    static_cast<int>(index));
}

c10::DataPtr HostAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return c10::DataPtr(nullptr, tag_);
  const size_t padded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* block = std::aligned_alloc(kAlignment, sizeof(BlockHeader) + padded);
  TORCH_CHECK_WITH(OutOfMemoryError, block != nullptr, "max_device: out of host memory allocating ",
                   nbytes, " bytes");
  static_cast<BlockHeader*>(block)->nbytes = nbytes;
  add(static_cast<int64_t>(nbytes));
  counters.allocations.fetch_add(1, std::memory_order_relaxed);
  void* data = static_cast<char*>(block) + sizeof(BlockHeader);
  return {data, data, &release, tag_};
}

void HostAllocator::release(void* ptr) {
  if (ptr == nullptr) return;
  auto* header = static_cast<BlockHeader*>(ptr) - 1;
  counters.allocated.fetch_sub(static_cast<int64_t>(header->nbytes), std::memory_order_relaxed);
  counters.frees.fetch_add(1, std::memory_order_relaxed);
  std::free(header);
}

void HostAllocator::add(int64_t nbytes) {
  const int64_t now = counters.allocated.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  int64_t peak = counters.peak.load(std::memory_order_relaxed);
  while (now > peak && !counters.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void HostAllocator::note_adopted(int64_t nbytes) { add(nbytes); }

void HostAllocator::note_adopted_release(int64_t nbytes) {
  counters.allocated.fetch_sub(nbytes, std::memory_order_relaxed);
}

void HostAllocator::copy_data(void* dest, const void* src, size_t count) const {
  std::memcpy(dest, src, count);
}

MemoryStats HostAllocator::stats() const {
  return {counters.allocated.load(), counters.peak.load(), counters.allocations.load(),
          counters.frees.load()};
}

void HostAllocator::reset_peak() { counters.peak.store(counters.allocated.load()); }

HostAllocator& allocator() {
  static HostAllocator instance(the_device());
  return instance;
}

HostAllocator& host_side_allocator() {
  static HostAllocator instance{c10::Device(c10::kCPU)};
  return instance;
}

namespace {
// Registered at load time of the loader library, before any tensor exists.
const bool registered = [] {
  c10::SetAllocator(kDeviceType, &allocator());
  return true;
}();
}  // namespace

}  // namespace maxdev::device
