// Device guard of max_device: device, streams and events (see streams.h).
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>

#include "device/allocator.h"
#include "device/streams.h"

namespace maxdev::device {
namespace {

// Stream ids: 0 is the default stream; a new stream gets a serial number,
// shifted left, with its priority level (0 or 1 = priority -1) in the low bit.
constexpr int kPriorityBits = 1;
constexpr c10::StreamId kPriorityMask = (1 << kPriorityBits) - 1;
std::atomic<c10::StreamId> next_stream_serial{1};

c10::StreamId new_stream_id(int priority) {
  priority = std::clamp(priority, kHighestStreamPriority, kLowestStreamPriority);
  const c10::StreamId level = -priority;
  return (next_stream_serial.fetch_add(1, std::memory_order_relaxed) << kPriorityBits) | level;
}

// Each thread's current stream, per device.
thread_local std::array<c10::StreamId, kMaxDevices> current_stream_ids{};

// An event's handle (its event_id in Python) points at the host time of
// its last record.
struct HostEvent {
  int64_t recorded_ns;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void check_stream(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kDeviceType, "max_device: expected a max_device stream, got one on ",
              stream.device());
  check_device_index(stream.device_index());
}

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDeviceType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device previous = current_device();
    set_current_device_index(d.index());
    return previous;
  }
  c10::Device getDevice() const override { return current_device(); }
  void setDevice(c10::Device d) const override { set_current_device_index(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) set_current_device_index(d.index());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  c10::Stream getStream(c10::Device d) const override {
    const auto index = resolve_device_index(d.index());
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDeviceType, index), current_stream_ids[index]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kDeviceType, resolve_device_index(d.index())));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return getNewStream(d, high_priority ? kHighestStreamPriority : kLowestStreamPriority);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDeviceType, resolve_device_index(d.index())),
                       new_stream_id(priority));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    check_stream(s);
    const auto index = resolve_device_index(s.device_index());
    const c10::Stream previous(c10::Stream::UNSAFE, c10::Device(kDeviceType, index), current_stream_ids[index]);
    current_stream_ids[index] = s.id();
    return previous;
  }

  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device_index(d.index());
    c10::DeviceCapability capability;  // every dtype but those max_device refuses
    auto& types = capability.capability_data.supported_scalar_types;
    types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = types.has_QUInt4x2 = types.has_QUInt2x4 = 0;
    types.has_ComplexHalf = 0;
    return capability;
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    check_stream(stream);
    check_device_index(device_index);
    auto* host_event = static_cast<HostEvent*>(*event);
    if (host_event == nullptr) {
      host_event = new HostEvent{0};
      *event = host_event;
    }
    host_event->recorded_ns = now_ns();
  }
  // Work is done when it is submitted: nothing to wait for.
  void block(void*, const c10::Stream& stream) const override { check_stream(stream); }
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<HostEvent*>(event);
  }
  bool queryStream(const c10::Stream& stream) const override {
    check_stream(stream);
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override { check_stream(stream); }
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    check_device_index(device_index);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "max_device: both events must be recorded before calculating elapsed time");
    const auto ns = static_cast<HostEvent*>(end)->recorded_ns - static_cast<HostEvent*>(start)->recorded_ns;
    return static_cast<double>(ns) / 1e6;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace

int stream_priority(c10::StreamId id) { return -static_cast<int>(id & kPriorityMask); }

}  // namespace maxdev::device
