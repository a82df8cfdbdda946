#include "device/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>

#include <vector>

#include "device/allocator.h"

namespace maxdev::device {
namespace {

class DeviceGenerator final : public c10::GeneratorImpl {
 public:
  DeviceGenerator(c10::DeviceIndex device, at::Generator engine)
      : c10::GeneratorImpl(c10::Device(kDeviceType, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        engine_(std::move(engine)) {}

  const at::Generator& engine() const { return engine_; }

  void set_current_seed(uint64_t seed) override { engine_.set_current_seed(seed); }
  uint64_t current_seed() const override { return engine_.current_seed(); }
  uint64_t seed() override { return engine_.seed(); }
  void set_offset(uint64_t offset) override { engine_.set_offset(offset); }
  uint64_t get_offset() const override { return engine_.get_offset(); }
  void set_state(const c10::TensorImpl& state) override {
    engine_.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return engine_.unsafeGetGeneratorImpl()->get_state();
  }

  static c10::DeviceType device_type() { return kDeviceType; }

 private:
  DeviceGenerator* clone_impl() const override {
    return new DeviceGenerator(device().index(), engine_.clone());
  }

  at::Generator engine_;
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  static const std::vector<at::Generator> instances = [] {
    std::vector<at::Generator> generators;
    generators.push_back(at::make_generator<DeviceGenerator>(0, at::detail::getDefaultCPUGenerator()));
    for (c10::DeviceIndex i = 1; i < device_count(); ++i) generators.push_back(new_generator(i));
    return generators;
  }();
  return instances.at(resolve_device_index(device));
}

at::Generator new_generator(c10::DeviceIndex device) {
  return at::make_generator<DeviceGenerator>(resolve_device_index(device),
                                             at::detail::createCPUGenerator(c10::default_rng_seed_val));
}

at::Generator cpu_engine(const std::optional<at::Generator>& generator) {
  const at::Generator& chosen =
      generator.has_value() && generator->defined() ? *generator : default_generator(-1);
  TORCH_CHECK(chosen.device().type() == kDeviceType,
              "Expected a 'max_device' device type for generator but found '", chosen.device().type(),
              "'");

  return static_cast<DeviceGenerator*>(chosen.unsafeGetGeneratorImpl())->engine();
}

}  // namespace maxdev::device
