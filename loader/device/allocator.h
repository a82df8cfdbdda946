// Host-memory allocators of the max_device device: 64-byte aligned, counted.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/TensorImpl.h>

#include <atomic>
#include <cstdint>

#include "common/thread_state.h"

namespace maxdev::device {

inline constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;
inline constexpr size_t kAlignment = 64;

// max_device has device_count() devices, max_device:0 .. max_device:N-1:
// MAX_DEVICE_COUNT in the environment (1..16, read once), default 2. All
// of them are host memory; each has its own current stream, memory
// statistics and default generator. Like CUDA's, the current device is
// per thread.
inline constexpr c10::DeviceIndex kMaxDevices = 16;
inline constexpr c10::DeviceIndex kDefaultDeviceCount = 2;
c10::DeviceIndex device_count();
c10::DeviceIndex current_device_index();
void set_current_device_index(c10::DeviceIndex index);  // checked
c10::Device current_device();

// A RuntimeError naming the device for an index that does not exist (as
// CUDA's "invalid device ordinal"); -1 (the current device) is fine.
void check_device_index(c10::DeviceIndex index);
// `index`, or the current device for -1.
c10::DeviceIndex resolve_device_index(c10::DeviceIndex index);

// Makes a device current on this thread for a scope (-1: stays as is), so
// what is allocated inside lands on it. Kernels registered by hand get no
// device guard from PyTorch; they open one of these.
class CurrentDeviceScope {
 public:
  explicit CurrentDeviceScope(c10::DeviceIndex index) : previous_(thread_state.current_device) {
    if (index != previous_) set_current_device_index(index);  // checked; -1 changes nothing
  }
  ~CurrentDeviceScope() { thread_state.current_device = previous_; }
  CurrentDeviceScope(const CurrentDeviceScope&) = delete;
  CurrentDeviceScope& operator=(const CurrentDeviceScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

struct MemoryStats {
  int64_t allocated_bytes;       // live bytes (own allocations + adopted CPU buffers)
  int64_t peak_allocated_bytes;  // high-water mark of allocated_bytes
  int64_t allocations;           // allocations made since start (or the last reset)
  int64_t frees;                 // allocations released since start (or the last reset)
};

// Two instances share one pool and one set of statistics per device:
// allocator() tags its buffers with the current max_device device;
// host_side_allocator() tags them CPU, for the CPU aliases the fallback
// hands to CPU kernels, which must see CPU memory even when they grow an
// alias (see host_alias.h). Both count a block against the current device.
//
// A c10::DeviceAllocator, so torch.accelerator's memory functions work.
// Nothing is cached (every block goes back to the C library at once), so
// reserved bytes equal allocated bytes and empty_cache() has nothing to do.
class HostAllocator final : public c10::DeviceAllocator {
 public:
  explicit HostAllocator(bool device_side) : device_side_(device_side) {}
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, size_t count) const override;

  MemoryStats stats(c10::DeviceIndex device) const;
  void reset_peak(c10::DeviceIndex device);
  void reset_accumulated(c10::DeviceIndex device);

  // Count bytes of a buffer another allocator made that a device tensor now
  // owns (outputs adopted from CPU kernels), so memory_allocated() sees them.
  void note_adopted(c10::DeviceIndex device, int64_t nbytes);
  void note_adopted_release(c10::DeviceIndex device, int64_t nbytes);

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

  bool device_side_;
};

// A storage not allocated yet (lazy allocation: no bytes under a tensor
// with elements) is an error, as ATen's data pointer check gives, never a
// null pointer for a plugin or CPU kernel. `data`: the storage's first
// byte. Callers add which argument of which op the tensor was.
void check_allocated(const c10::TensorImpl& impl, const void* data);

HostAllocator& allocator();
HostAllocator& host_side_allocator();

// Pinned host memory (tensor.pin_memory(), DataLoader(pin_memory=True)):
// page-locked with mlock() where RLIMIT_MEMLOCK allows, and known to
// is_pinned() whether or not the lock was granted.
c10::Allocator& pinned_allocator();
bool is_pinned(const void* ptr);

}  // namespace maxdev::device
