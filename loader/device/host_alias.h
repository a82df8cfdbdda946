// Zero-copy bridge between max_device tensors and CPU tensors.
//
// max_device memory is host RAM, so a CPU kernel can work on a device
// tensor's bytes directly. A HostAliasScope hands CPU kernels CPU "aliases"
// of device tensors (same bytes, storage offset, sizes and strides; the
// alias storage covers the whole device storage) and turns what the kernel
// returns back into device tensors:
//   - a result that lives in an alias storage becomes a view of the device
//     storage (in-place and out= results become the argument itself);
//   - a result the kernel allocated is adopted: a device storage takes over
//     the CPU buffer, no bytes move (a fresh result that nothing else holds
//     is turned into the device tensor in place, its own objects reused).
// If a kernel resizes an alias (out= of the wrong size), the alias storage
// grows with the device allocator and commit() re-seats the device storage
// on the new buffer, so every view of it sees the result.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace maxdev::device {

class HostAliasScope {
 public:
  HostAliasScope();
  // Keeps the aliases nothing else holds for the thread's next calls.
  ~HostAliasScope();
  HostAliasScope(const HostAliasScope&) = delete;
  HostAliasScope& operator=(const HostAliasScope&) = delete;

  // A CPU tensor over the bytes of `device_tensor` (a max_device tensor),
  // which the kernel writes if `written` (in-place self, out=).
  at::Tensor to_cpu(const at::Tensor& device_tensor, bool written = false);

  // Call once the kernel returned, before to_device()/sync_back().
  void commit();

  // The max_device tensor for a kernel result (CPU tensors only; others
  // are returned unchanged).
  at::Tensor to_device(const at::Tensor& result);

  // After commit(): a kernel may have changed the aliases it writes
  // (resize_, set_, _set_conj); each written device tensor takes its
  // alias's storage, geometry and conjugate/negative bits.
  void sync_back_written();

 private:
  friend class AliasPool;  // keeps a large call's index for the next one
  struct StoragePair {
    c10::StorageImpl* device;  // owned by the device tensors of the call
    c10::Storage alias;        // CPU storage over the same bytes
    const void* original_data;
  };
  struct TensorPair {
    at::Tensor alias;
    at::Tensor device;
    bool written;
  };
  // What the scope's objects are, by address: an index entry's kind.
  enum class Role : uint32_t { DeviceTensor, AliasTensor, DeviceStorage, AliasStorage, AdoptedCpuStorage };
  class Index;
  // Below this many tensors a scan beats hashing (most calls have one to four).
  static constexpr size_t kIndexFromTensors = 16;

  const StoragePair* find_alias(const c10::StorageImpl* alias_storage) const;
  c10::Storage device_storage_for(const c10::Storage& cpu_storage);
  // The position in tensors_/storages_/adopted_ of the entry whose `role`
  // object is `key`, or -1.
  int64_t position_of(const void* key, Role role) const;
  // Records a new entry in the index, once the call has one or grew large
  // enough to need it; inline, since most calls have neither.
  void note(const void* key, Role role, size_t position) {
    if (index_ || tensors_.size() >= kIndexFromTensors) note_indexed(key, role, position);
  }
  void note_indexed(const void* key, Role role, size_t position);
  void sync_back(const at::Tensor& device_tensor, const at::Tensor& alias);

  c10::SmallVector<StoragePair, 4> storages_;
  c10::SmallVector<TensorPair, 4> tensors_;
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 2> adopted_;
  // Built once a call has many tensors (a fused optimizer's lists): finding
  // each argument's alias by a scan of the others was quadratic.
  std::unique_ptr<Index> index_;
};

// A max_device tensor with the given storage and the geometry of `like`.
at::Tensor device_tensor_on(c10::Storage storage, const at::Tensor& like);

// Adopt a CPU-allocated storage as a storage of the current max_device
// device without copying.
c10::Storage adopt_cpu_storage(const c10::Storage& cpu_storage);

// The CPU storage whose buffer `device_storage` adopted, if it did.
std::optional<c10::Storage> adopted_cpu_storage(const c10::Storage& device_storage);

// Re-seat `device_storage` on the buffer of `cpu_storage` (same byte size;
// the caller copied the bytes): every tensor and view of the device storage
// then reads and writes that buffer (how a storage moves to shared memory),
// and the storage is no longer resizable.
void rehost(const c10::Storage& device_storage, const c10::Storage& cpu_storage);

inline bool is_device_tensor(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

}  // namespace maxdev::device
