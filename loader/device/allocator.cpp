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

}  // namespace

c10::Device the_device() { return c10::Device(kDeviceType, 0); }

void check_device_index(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(index == -1 || index == 0,
                    "max_device has a single device, max_device:0; got max_device:",
                    static_cast<int>(index));
}

c10::DataPtr HostAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return c10::DataPtr(nullptr, the_device());
  const size_t padded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* block = std::aligned_alloc(kAlignment, sizeof(BlockHeader) + padded);
  TORCH_CHECK_WITH(OutOfMemoryError, block != nullptr, "max_device: out of host memory allocating ",
                   nbytes, " bytes");
  static_cast<BlockHeader*>(block)->nbytes = nbytes;
  add(static_cast<int64_t>(nbytes));
  allocations_.fetch_add(1, std::memory_order_relaxed);
  void* data = static_cast<char*>(block) + sizeof(BlockHeader);
  return {data, data, &release, the_device()};
}

void HostAllocator::release(void* ptr) {
  if (ptr == nullptr) return;
  auto* header = static_cast<BlockHeader*>(ptr) - 1;
  auto& self = allocator();
  self.allocated_.fetch_sub(static_cast<int64_t>(header->nbytes), std::memory_order_relaxed);
  self.frees_.fetch_add(1, std::memory_order_relaxed);
  std::free(header);
}

void HostAllocator::add(int64_t nbytes) {
  const int64_t now = allocated_.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void HostAllocator::note_adopted(int64_t nbytes) { add(nbytes); }

void HostAllocator::note_adopted_release(int64_t nbytes) {
  allocated_.fetch_sub(nbytes, std::memory_order_relaxed);
}

void HostAllocator::copy_data(void* dest, const void* src, size_t count) const {
  std::memcpy(dest, src, count);
}

MemoryStats HostAllocator::stats() const {
  return {allocated_.load(), peak_.load(), allocations_.load(), frees_.load()};
}

void HostAllocator::reset_peak() { peak_.store(allocated_.load()); }

HostAllocator& allocator() {
  static HostAllocator instance;
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
