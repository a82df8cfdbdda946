// Host-memory allocators of the max_device device: 64-byte aligned, counted.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <cstdint>

namespace maxdev::device {

inline constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;
inline constexpr size_t kAlignment = 64;

// The one device there is: index 0. Any other index is a RuntimeError, as
// for a CUDA device that does not exist.
c10::Device the_device();
void check_device_index(c10::DeviceIndex index);

struct MemoryStats {
  int64_t allocated_bytes;       // live bytes (own allocations + adopted CPU buffers)
  int64_t peak_allocated_bytes;  // high-water mark of allocated_bytes
  int64_t allocations;           // allocations made since start (or the last reset)
  int64_t frees;                 // allocations released since start (or the last reset)
};

// Two instances share one pool and one set of statistics: allocator()
// tags its buffers max_device; host_side_allocator() tags them CPU, for the
// CPU aliases the fallback hands to CPU kernels, which must see CPU memory
// even when they grow an alias (see host_alias.h).
//
// A c10::DeviceAllocator, so torch.accelerator's memory functions work.
// Nothing is cached (every block goes back to the C library at once), so
// reserved bytes equal allocated bytes and empty_cache() has nothing to do.
class HostAllocator final : public c10::DeviceAllocator {
 public:
  explicit HostAllocator(c10::Device tag) : tag_(tag) {}
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, size_t count) const override;

  MemoryStats stats() const;
  void reset_peak();
  void reset_accumulated();

  // Count bytes of a buffer another allocator made that a device tensor now
  // owns (outputs adopted from CPU kernels), so memory_allocated() sees them.
  void note_adopted(int64_t nbytes);
  void note_adopted_release(int64_t nbytes);

  // c10::DeviceAllocator
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // Free and total host RAM (sysinfo), the memory max_device allocates from.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

 private:
  static void release(void* ptr);
  static void add(int64_t nbytes);

  c10::Device tag_;
};

HostAllocator& allocator();
HostAllocator& host_side_allocator();

// Pinned host memory (tensor.pin_memory(), DataLoader(pin_memory=True)):
// page-locked with mlock() where RLIMIT_MEMLOCK allows, and known to
// is_pinned() whether or not the lock was granted.
c10::Allocator& pinned_allocator();
bool is_pinned(const void* ptr);

}  // namespace maxdev::device
