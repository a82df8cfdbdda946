// Host-memory allocator of the max_device device: 64-byte aligned, counted.
#pragma once

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstdint>

namespace maxdev::device {

inline constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;
inline constexpr size_t kAlignment = 64;

// The one device there is: index 0. Anything else is a clear error.
c10::Device the_device();
void check_device_index(c10::DeviceIndex index);

struct MemoryStats {
  int64_t allocated_bytes;       // live bytes (own allocations + adopted CPU buffers)
  int64_t peak_allocated_bytes;  // high-water mark of allocated_bytes
  int64_t allocations;           // allocations made since start
  int64_t frees;                 // allocations released since start
};

// Two instances share one pool and one set of statistics: allocator()
// tags its buffers max_device; host_side_allocator() tags them CPU, for the
// CPU aliases the fallback hands to CPU kernels, which must see CPU memory
// even when they grow an alias (see host_alias.h).
class HostAllocator final : public c10::Allocator {
 public:
  explicit HostAllocator(c10::Device tag) : tag_(tag) {}
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, size_t count) const override;

  MemoryStats stats() const;
  void reset_peak();

  // Count bytes of a buffer another allocator made that a device tensor now
  // owns (outputs adopted from CPU kernels), so memory_allocated() sees them.
  void note_adopted(int64_t nbytes);
  void note_adopted_release(int64_t nbytes);

 private:
  static void release(void* ptr);
  static void add(int64_t nbytes);

  c10::Device tag_;
};

HostAllocator& allocator();
HostAllocator& host_side_allocator();

}  // namespace maxdev::device
