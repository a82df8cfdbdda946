#include "device/host_alias.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include "common/thread_state.h"
#include "device/allocator.h"

namespace maxdev::device {
namespace {

// The alias DataPtr keeps the device storage alive: a CPU kernel may hand an
// alias back or keep it for the duration of the call.
void release_storage_ref(void* ctx) {
  c10::intrusive_ptr<c10::StorageImpl>::reclaim(static_cast<c10::StorageImpl*>(ctx));
}

// Points a CPU alias storage at the bytes of `device_storage`.
void point_at(c10::StorageImpl* alias, c10::StorageImpl* device_storage) {
  void* data = device_storage->mutable_data();
  c10::raw::intrusive_ptr::incref(device_storage);
  alias->set_data_ptr_noswap(c10::DataPtr(data, device_storage, &release_storage_ref, c10::Device(c10::kCPU)));
  alias->set_nbytes(device_storage->nbytes());
  // Resizable with the host-side allocator: an out= kernel may grow it (and
  // views of the grown alias still read as CPU), and commit() moves the
  // grown buffer to the device storage. Not if the device storage cannot
  // grow (shared memory): then the kernel raises PyTorch's error.
  alias->set_resizable(device_storage->resizable());
}

c10::Storage alias_storage(c10::StorageImpl* device_storage) {
  c10::Storage alias(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(), &host_side_allocator(), false);
  point_at(alias.unsafeGetStorageImpl(), device_storage);
  return alias;
}

// Element by element, inline: IntArrayRef's == calls memcmp, several times
// the cost for the one to four dimensions of most tensors.
bool same_ints(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

void take_geometry(c10::TensorImpl* impl, const at::Tensor& like) {
  // A pooled alias often had this shape last time (the same tensor again):
  // then only the offset is set, without recomputing the contiguity flags.
  if (same_ints(impl->sizes(), like.sizes()) && same_ints(impl->strides(), like.strides())) {
    impl->set_storage_offset(like.storage_offset());
  } else {
    impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  }
  if (impl->is_conj() != like.is_conj()) impl->_set_conj(like.is_conj());
  if (impl->is_neg() != like.is_neg()) impl->_set_neg(like.is_neg());
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                     like.dtype());
  take_geometry(t.unsafeGetTensorImpl(), like);
  return t;
}

}  // namespace

// An open-addressing table from (address, role) of a scope's objects to
// their positions. Each key is a live object the scope holds (or, for a
// device storage, one its device tensors hold). One table serves a thread's
// calls in turn (it waits in the thread's alias pool): clearing it starts a
// new stamp instead of rewriting the slots.
class HostAliasScope::Index {
 public:
  void clear() {
    if (++stamp_ == 0) {  // the stamps wrapped: every slot could look current
      std::fill(slots_.begin(), slots_.end(), Slot{});
      stamp_ = 1;
    }
    used_ = 0;
  }

  int64_t find(const void* key, Role role) const {
    if (slots_.empty()) return -1;
    const uintptr_t tagged = tag(key, role);
    for (size_t i = slot_of(tagged);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& slot = slots_[i];
      if (slot.stamp != stamp_) return -1;
      if (slot.tagged == tagged) return slot.position;
    }
  }

  // Adding a key twice keeps the first: the index is built from the entries
  // so far, the newest included, by the call that notes one of them.
  void add(const void* key, Role role, size_t position) {
    if (find(key, role) >= 0) return;
    if (2 * (used_ + 1) > slots_.size()) grow();
    insert({tag(key, role), stamp_, static_cast<uint32_t>(position)});
    ++used_;
  }

 private:
  struct Slot {
    uintptr_t tagged = 0;  // the address with its role in the alignment bits
    uint32_t stamp = 0;    // the slot is in use when this is the table's stamp
    uint32_t position = 0;
  };

  // TensorImpls and StorageImpls are at least 8-byte aligned: the low bits
  // hold the role.
  static uintptr_t tag(const void* key, Role role) {
    TORCH_INTERNAL_ASSERT_DEBUG_ONLY((reinterpret_cast<uintptr_t>(key) & 7) == 0);
    return reinterpret_cast<uintptr_t>(key) | static_cast<uintptr_t>(role);
  }

  // Fibonacci hashing: the product's top bits depend on every bit of the key.
  size_t slot_of(uintptr_t tagged) const { return static_cast<size_t>((tagged * 0x9E3779B97F4A7C15ull) >> shift_); }

  void insert(const Slot& entry) {
    size_t i = slot_of(entry.tagged);
    while (slots_[i].stamp == stamp_) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = entry;
  }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    const size_t size = old.empty() ? 256 : 2 * old.size();
    slots_.assign(size, Slot{});
    shift_ = 64 - __builtin_ctzll(size);
    for (const Slot& slot : old) {
      if (slot.stamp == stamp_) insert(slot);
    }
  }

  std::vector<Slot> slots_;
  size_t used_ = 0;
  uint32_t stamp_ = 1;
  int shift_ = 64;
};

// The aliases of finished calls that nothing else holds, kept per thread
// for the next calls' arguments: making and freeing an alias (a TensorImpl,
// its version counter and a StorageImpl, three heap blocks) was most of
// the fallback's cost per device argument. A parked alias points at no
// bytes and holds no device storage; one that anything else still
// references (a kernel kept it, Python wrapped it, autograd met it) or
// whose kind a kernel changed is freed as before, never parked.
class AliasPool {
 public:
  // Enough for a fused optimizer's lists (5 lists x the parameters).
  static constexpr size_t kCapacity = 512;

  // An alias of `device_tensor` over `device_storage`, its storage (which
  // no other alias of the call shares), or an undefined tensor when none is
  // parked.
  at::Tensor take(const at::Tensor& device_tensor, c10::StorageImpl* device_storage) {
    auto& parked = parked_[c10::InferenceMode::is_enabled()];
    if (parked.empty()) return {};
    at::Tensor alias = std::move(parked.back());
    parked.pop_back();
    auto* impl = alias.unsafeGetTensorImpl();
    // A parked alias is a plain TensorImpl with a storage (park checks).
    point_at(impl->unsafe_storage().unsafeGetStorageImpl(), device_storage);
    if (impl->dtype() != device_tensor.dtype()) impl->set_storage_and_dtype(impl->storage(), device_tensor.dtype());
    take_geometry(impl, device_tensor);
    return alias;
  }

  // The index a large call builds, kept for the thread's next one.
  std::unique_ptr<HostAliasScope::Index> spare_index;

  void park(at::Tensor&& alias) {
    auto* impl = alias.unsafeGetTensorImpl();
    const bool inference = impl->is_inference();
    auto& parked = parked_[inference];
    if (parked.size() >= kCapacity || alias.use_count() != 1 || alias.weak_use_count() != 1 ||
        typeid(*impl) != typeid(c10::TensorImpl) || impl->key_set() != fresh_key_set(inference) ||
        impl->pyobj_slot()->load_pyobj() != nullptr || impl->autograd_meta() != nullptr ||
        impl->get_backend_meta() != nullptr || impl->is_wrapped_number() || !impl->has_storage()) {
      return;
    }
    const c10::Storage& storage = impl->unsafe_storage();
    auto* storage_impl = storage.unsafeGetStorageImpl();
    if (storage.use_count() != 1 || c10::raw::weak_intrusive_ptr::use_count(storage_impl) != 1 ||
        storage_impl->pyobj_slot()->load_pyobj() != nullptr || storage_impl->allocator() != &host_side_allocator()) {
      return;
    }
    storage_impl->set_data_ptr_noswap(c10::DataPtr());  // lets go of the device storage
    storage_impl->set_nbytes(0);
    parked.push_back(std::move(alias));
  }

 private:
  // What a TensorImpl made with the CPU key has, as TensorImpl's
  // constructor decides (autograd and autocast keys outside inference mode).
  static c10::DispatchKeySet fresh_key_set(bool inference) {
    static const auto made_with = [](bool inference_mode) {
      c10::InferenceMode mode(inference_mode);
      return c10::make_intrusive<c10::TensorImpl>(c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                  caffe2::TypeMeta::Make<float>(), c10::Device(c10::kCPU))
          ->key_set();
    };
    static const c10::DispatchKeySet sets[2] = {made_with(false), made_with(true)};
    return sets[inference];
  }

  std::vector<at::Tensor> parked_[2];  // made outside / inside inference mode
};

namespace {

// Each thread's pool, reached through the initial-exec thread state; the
// owner frees it when the thread exits. A fallback call later in the
// thread's exit (another thread-local's destructor) runs without a pool.
struct AliasPoolOwner {
  ~AliasPoolOwner() {
    delete thread_state.alias_pool;
    thread_state.alias_pool = nullptr;
    thread_state.alias_pool_closed = true;
  }
};
thread_local AliasPoolOwner alias_pool_owner;

AliasPool* alias_pool() {
  if (thread_state.alias_pool == nullptr && !thread_state.alias_pool_closed) {
    (void)alias_pool_owner;  // instantiate the thread's owner
    thread_state.alias_pool = new AliasPool;
  }
  return thread_state.alias_pool;
}

// What a device storage over a buffer another allocator made owns: the CPU
// storage it adopted (one that others may still hold: a result the kernel
// kept or that shares its buffer, a shared-memory storage), or the buffer
// alone (a CPU kernel's result converted in place).
struct AdoptedBuffer {
  c10::intrusive_ptr<c10::StorageImpl> cpu_storage;
  c10::DataPtr cpu_data;
  int64_t nbytes;
  c10::DeviceIndex device;
};

void release_adopted(void* ctx) {
  auto* adopted = static_cast<AdoptedBuffer*>(ctx);
  allocator().note_adopted_release(adopted->device, adopted->nbytes);
  delete adopted;
}

c10::DataPtr adopted_data_ptr(void* data, AdoptedBuffer* adopted) {
  allocator().note_adopted(adopted->device, adopted->nbytes);
  return c10::DataPtr(data, adopted, &release_adopted, c10::Device(kDeviceType, adopted->device));
}

// A CPU kernel's fresh result that nothing else holds (a plain strided
// tensor on a storage of its own from the CPU allocator) becomes the device
// tensor itself: its storage keeps the buffer under a device DataPtr and
// the device allocator, its TensorImpl takes the device's dispatch keys.
// No TensorImpl or StorageImpl is made, the common case of every fallback
// call with an output.
bool convert_in_place(const at::Tensor& result) {
  auto* impl = result.unsafeGetTensorImpl();
  if (result.use_count() != 1 || result.weak_use_count() != 1 || typeid(*impl) != typeid(c10::TensorImpl) ||
      result.layout() != c10::kStrided || impl->key_set().highestBackendKey() != c10::BackendComponent::CPUBit ||
      !impl->has_storage()) {
    return false;
  }
  const c10::Storage& storage = impl->unsafe_storage();  // a plain TensorImpl with a storage
  auto* storage_impl = storage.unsafeGetStorageImpl();
  if (storage.use_count() != 1 || !storage_impl->resizable() || storage_impl->allocator() != c10::GetCPUAllocator() ||
      storage_impl->device_type() != c10::kCPU) {
    return false;
  }
  const auto nbytes = static_cast<int64_t>(storage_impl->nbytes());
  auto* adopted = new AdoptedBuffer{{}, storage_impl->set_data_ptr(c10::DataPtr()), nbytes, current_device_index()};
  storage_impl->set_data_ptr_noswap(adopted_data_ptr(adopted->cpu_data.mutable_get(), adopted));
  storage_impl->set_allocator(&allocator());
  impl->set_storage_keep_dtype(storage);  // its device follows the storage's
  impl->_change_backend_component_keys(c10::Device(kDeviceType, adopted->device));
  return true;
}

}  // namespace

at::Tensor device_tensor_on(c10::Storage storage, const at::Tensor& like) {
  return tensor_on(std::move(storage), c10::DispatchKey::PrivateUse1, like);
}

c10::Storage adopt_cpu_storage(const c10::Storage& cpu_storage) {
  auto* impl = cpu_storage.unsafeGetStorageImpl();
  const auto nbytes = static_cast<int64_t>(impl->nbytes());
  void* data = impl->mutable_data();
  auto* adopted = new AdoptedBuffer{c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl), c10::DataPtr(), nbytes,
                                    current_device_index()};
  return c10::Storage(c10::Storage::use_byte_size_t(), impl->nbytes(), adopted_data_ptr(data, adopted), &allocator(),
                      /*resizable=*/true);
}

std::optional<c10::Storage> adopted_cpu_storage(const c10::Storage& device_storage) {
  const c10::DataPtr& ptr = device_storage.data_ptr();
  if (ptr.get_deleter() != &release_adopted) return std::nullopt;
  const auto& cpu = static_cast<AdoptedBuffer*>(ptr.get_context())->cpu_storage;
  if (!cpu) return std::nullopt;
  return c10::Storage(cpu);
}

void rehost(const c10::Storage& device_storage, const c10::Storage& cpu_storage) {
  TORCH_CHECK(device_storage.device().type() == c10::DeviceType::PrivateUse1 && cpu_storage.device().is_cpu(),
              "max_device: rehost() moves a max_device storage onto a CPU buffer; got ", device_storage.device(),
              " and ", cpu_storage.device());
  TORCH_CHECK(device_storage.nbytes() == cpu_storage.nbytes(), "max_device: rehost() needs storages of one size; got ",
              device_storage.nbytes(), " and ", cpu_storage.nbytes(), " bytes");
  CurrentDeviceScope on(device_storage.device().index());
  c10::Storage adopted = adopt_cpu_storage(cpu_storage);
  auto* impl = device_storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(adopted.unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr()));
  // As a CPU storage in shared memory: growing it would leave the buffer
  // other processes map.
  impl->set_resizable(false);
}

namespace {

template <typename Entries, typename Key>
int64_t scan(const Entries& entries, const void* key, Key key_of) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (key_of(entries[i]) == key) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

HostAliasScope::HostAliasScope() = default;

int64_t HostAliasScope::position_of(const void* key, Role role) const {
  if (index_) return index_->find(key, role);
  switch (role) {
    case Role::DeviceTensor:
      return scan(tensors_, key, [](const TensorPair& p) -> const void* { return p.device.unsafeGetTensorImpl(); });
    case Role::AliasTensor:
      return scan(tensors_, key, [](const TensorPair& p) -> const void* { return p.alias.unsafeGetTensorImpl(); });
    case Role::DeviceStorage:
      return scan(storages_, key, [](const StoragePair& p) -> const void* { return p.device; });
    case Role::AliasStorage:
      return scan(storages_, key, [](const StoragePair& p) -> const void* { return p.alias.unsafeGetStorageImpl(); });
    case Role::AdoptedCpuStorage:
      return scan(adopted_, key, [](const auto& p) -> const void* { return p.first; });
  }
  return -1;
}

void HostAliasScope::note_indexed(const void* key, Role role, size_t position) {
  if (index_) {
    index_->add(key, role, position);
    return;
  }
  // The call grew large: index everything so far, this entry included.
  AliasPool* pool = alias_pool();
  index_ = pool != nullptr && pool->spare_index ? std::move(pool->spare_index) : std::make_unique<Index>();
  index_->clear();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    index_->add(tensors_[i].device.unsafeGetTensorImpl(), Role::DeviceTensor, i);
    index_->add(tensors_[i].alias.unsafeGetTensorImpl(), Role::AliasTensor, i);
  }
  for (size_t i = 0; i < storages_.size(); ++i) {
    index_->add(storages_[i].device, Role::DeviceStorage, i);
    index_->add(storages_[i].alias.unsafeGetStorageImpl(), Role::AliasStorage, i);
  }
  for (size_t i = 0; i < adopted_.size(); ++i) index_->add(adopted_[i].first, Role::AdoptedCpuStorage, i);
}

at::Tensor HostAliasScope::to_cpu(const at::Tensor& device_tensor, bool written) {
  // One alias per device tensor: a kernel that gets the same tensor twice
  // (logical_and_ is logical_and.out(self, other, out=self)) must see one
  // tensor, or it treats the output as a separate tensor it may resize.
  auto* device_impl = device_tensor.unsafeGetTensorImpl();
  if (const int64_t known = position_of(device_impl, Role::DeviceTensor); known >= 0) {
    tensors_[known].written |= written;
    return tensors_[known].alias;
  }
  auto* device_storage = device_tensor.storage().unsafeGetStorageImpl();
  if (C10_UNLIKELY(device_storage->data() == nullptr)) check_allocated(*device_tensor.unsafeGetTensorImpl(), nullptr);
  at::Tensor cpu;
  if (const int64_t shared = position_of(device_storage, Role::DeviceStorage); shared >= 0) {
    cpu = tensor_on(storages_[shared].alias, c10::DispatchKey::CPU, device_tensor);
  } else {
    if (AliasPool* pool = alias_pool()) cpu = pool->take(device_tensor, device_storage);
    if (!cpu.defined()) cpu = tensor_on(alias_storage(device_storage), c10::DispatchKey::CPU, device_tensor);
    const c10::Storage& alias = cpu.unsafeGetTensorImpl()->unsafe_storage();  // ours: a plain TensorImpl
    storages_.push_back({device_storage, alias, alias.data()});
    note(device_storage, Role::DeviceStorage, storages_.size() - 1);
    note(alias.unsafeGetStorageImpl(), Role::AliasStorage, storages_.size() - 1);
  }
  tensors_.push_back({cpu, device_tensor, written});
  note(device_impl, Role::DeviceTensor, tensors_.size() - 1);
  note(cpu.unsafeGetTensorImpl(), Role::AliasTensor, tensors_.size() - 1);
  return cpu;
}

HostAliasScope::~HostAliasScope() {
  if (tensors_.empty()) return;
  AliasPool* pool = alias_pool();
  if (pool == nullptr) return;
  if (index_ && !pool->spare_index) pool->spare_index = std::move(index_);
  storages_.clear();  // the scope's own references to the alias storages
  // Last parked is first taken: the next call with the same arguments gets
  // each alias in the geometry it already has.
  for (auto pair = tensors_.rbegin(); pair != tensors_.rend(); ++pair) pool->park(std::move(pair->alias));
}

void HostAliasScope::commit() {
  for (auto& pair : storages_) {
    auto* alias = pair.alias.unsafeGetStorageImpl();
    if (alias->data() == pair.original_data) continue;
    // The kernel resized the alias: the new buffer came from the host-side
    // allocator (same pool); hand it to the device storage as device memory.
    c10::DataPtr grown = alias->set_data_ptr(c10::DataPtr());
    grown.unsafe_set_device(pair.device->device());
    pair.device->set_data_ptr_noswap(std::move(grown));
    pair.device->set_nbytes(alias->nbytes());
    alias->set_nbytes(0);
    // From now on the alias storage stands for the device storage only by
    // identity (find_alias).
  }
}

const HostAliasScope::StoragePair* HostAliasScope::find_alias(const c10::StorageImpl* alias_storage) const {
  const int64_t position = position_of(alias_storage, Role::AliasStorage);
  return position >= 0 ? &storages_[position] : nullptr;
}

c10::Storage HostAliasScope::device_storage_for(const c10::Storage& cpu_storage) {
  const auto* impl = cpu_storage.unsafeGetStorageImpl();
  if (const auto* pair = find_alias(impl)) {
    return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(pair->device));
  }
  if (const int64_t adopted = position_of(impl, Role::AdoptedCpuStorage); adopted >= 0) return adopted_[adopted].second;
  auto device = adopt_cpu_storage(cpu_storage);
  adopted_.emplace_back(impl, device);
  note(impl, Role::AdoptedCpuStorage, adopted_.size() - 1);
  return device;
}

at::Tensor HostAliasScope::to_device(const at::Tensor& result) {
  if (!result.defined() || result.device().type() != c10::kCPU) return result;
  if (const int64_t alias = position_of(result.unsafeGetTensorImpl(), Role::AliasTensor); alias >= 0) {
    return tensors_[alias].device;
  }
  if (convert_in_place(result)) return result;
  return device_tensor_on(device_storage_for(result.storage()), result);
}

void HostAliasScope::sync_back_written() {
  for (const auto& pair : tensors_) {
    if (pair.written) sync_back(pair.device, pair.alias);
  }
}

void HostAliasScope::sync_back(const at::Tensor& device_tensor, const at::Tensor& alias) {
  auto* impl = device_tensor.unsafeGetTensorImpl();
  if (alias.storage().unsafeGetStorageImpl() != nullptr) {
    const auto* pair = find_alias(alias.storage().unsafeGetStorageImpl());
    if (pair == nullptr || pair->device != impl->storage().unsafeGetStorageImpl()) {
      impl->set_storage_keep_dtype(device_storage_for(alias.storage()));
    }
  }
  if (impl->sizes() != alias.sizes() || impl->strides() != alias.strides() ||
      impl->storage_offset() != alias.storage_offset()) {
    impl->set_sizes_and_strides(alias.sizes(), alias.strides(), alias.storage_offset());
  }
  // Kernels may flip these too: linalg_lu_solve.out with left=False writes
  // X^H's values and sets out's conjugate bit.
  if (impl->is_conj() != alias.is_conj()) impl->_set_conj(alias.is_conj());
  if (impl->is_neg() != alias.is_neg()) impl->_set_neg(alias.is_neg());
}

}  // namespace maxdev::device
