// PrivateUse1 hooks: how PyTorch asks max_device about devices, generators
// and pointers.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <cstring>

#include "device/allocator.h"
#include "device/generator.h"

namespace maxdev::device {
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    check_device_index(index);
    return true;
  }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device_index(index); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device_index(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex previous = current_device_index();
    set_current_device_index(index);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(resolve_device_index(index));
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return new_generator(resolve_device_index(index));
  }

  // Every device is host memory: a pointer says nothing about its device.
  at::Device getDeviceFromPtr(void*) const override { return current_device(); }
  bool isPinnedPtr(const void* ptr) const override { return is_pinned(ptr); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }

  // untyped_storage().resize_() on a max_device storage.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    TORCH_CHECK(storage.resizable(), "max_device: this storage is not resizable");
    auto* impl = storage.unsafeGetStorageImpl();
    CurrentDeviceScope on(storage.device().index());
    c10::DataPtr fresh = allocator().allocate(nbytes);
    if (impl->data() != nullptr && nbytes > 0) {
      std::memcpy(fresh.get(), impl->data(), std::min(nbytes, impl->nbytes()));
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(nbytes);
  }
};

const bool registered = [] {
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

}  // namespace
}  // namespace maxdev::device
