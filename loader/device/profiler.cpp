// Profiler hooks of max_device: what torch.autograd.profiler.profile(
// use_device="max_device") records around every op. Kernels run
// synchronously on the calling thread, so the device time of an op is host
// time between two records, on the steady clock; no record can fail.
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <chrono>

namespace maxdev::device {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ProfilerHooks final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device != nullptr) *device = 0;
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    *event = std::make_shared<int64_t>(steady_ns());
  }
  // Microseconds, as PyTorch's CUDA hooks report.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    const auto ns = *static_cast<const int64_t*>(end->get()) - *static_cast<const int64_t*>(start->get());
    return static_cast<float>(ns) / 1000.0f;
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override { op(0); }
  void synchronize() const override {}
};

const bool registered = [] {
  static ProfilerHooks hooks;
  torch::profiler::impl::registerPrivateUse1Methods(&hooks);
  return true;
}();

}  // namespace
}  // namespace maxdev::device
