#include "device/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>

#include "device/allocator.h"

namespace maxdev::device {
namespace {

class DeviceGenerator final : public c10::GeneratorImpl {
 public:
  explicit DeviceGenerator(at::Generator engine)
      : c10::GeneratorImpl(the_device(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
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
  DeviceGenerator* clone_impl() const override { return new DeviceGenerator(engine_.clone()); }

  at::Generator engine_;
};

}  // namespace

const at::Generator& default_generator() {
  static at::Generator instance = at::make_generator<DeviceGenerator>(at::detail::getDefaultCPUGenerator());
  return instance;
}

at::Generator new_generator() {
  return at::make_generator<DeviceGenerator>(at::detail::createCPUGenerator(c10::default_rng_seed_val));
}

at::Generator cpu_engine(const std::optional<at::Generator>& generator) {
  const at::Generator& chosen =
      generator.has_value() && generator->defined() ? *generator : default_generator();
  TORCH_CHECK(chosen.device().type() == kDeviceType,
              "Expected a 'max_device' device type for generator but found '", chosen.device().type(),
              "'");
  return static_cast<DeviceGenerator*>(chosen.unsafeGetGeneratorImpl())->engine();
}

}  // namespace maxdev::device
