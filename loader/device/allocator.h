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

class HostAllocator final : public c10::Allocator {
 public:
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
  void add(int64_t nbytes);

  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> allocations_{0};
  std::atomic<int64_t> frees_{0};
};

HostAllocator& allocator();

}  // namespace maxdev::device
