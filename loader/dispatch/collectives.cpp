// torch.distributed collectives on max_device tensors, zero copy.
//
// A collective reaches a backend through c10d's dispatcher ops
// (c10d::allreduce_, ...), whose PrivateUse1 kernels hand the tensors to the
// backend registered for max_device in the process group: Gloo (see
// python/max_device/distributed.py), which accepts only CPU tensors. Since
// max_device memory is host RAM, a kernel on BackendSelect (the last key
// before the backend's, present in every call, inference mode included)
// swaps each max_device tensor for a CPU alias of its bytes, runs the
// PrivateUse1 kernel on the aliases, and turns the results, and the Work's
// result and future, back into the max_device tensors. Gloo reads and writes
// the device memory directly; the Work is Gloo's own, wrapped, so async
// collectives stay async. Calls without a max_device tensor pass through.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>

#include "device/allocator.h"
#include "device/host_alias.h"

namespace maxdev::dispatch {
namespace {

using device::is_device_tensor;

// The c10d ops that carry tensors to a backend (torch/csrc/distributed/c10d/Ops.cpp).
constexpr const char* kCollectiveOps[] = {
    "broadcast_",          "allreduce_",          "allreduce_coalesced_",
    "allgather_",          "_allgather_base_",    "allgather_coalesced_",
    "allgather_into_tensor_coalesced_",           "reduce_scatter_",
    "_reduce_scatter_base_",                      "reduce_scatter_tensor_coalesced_",
    "reduce_",             "gather_",             "scatter_",
    "alltoall_",           "alltoall_base_",      "barrier",
    "monitored_barrier_",  "send",                "recv_",
    "recv_any_source_",
};

// Applies `fn` to every tensor in `value` (a tensor, an optional tensor, a
// list of tensors or a list of such lists), rebuilding the lists.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) return fn(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> mapped;
    mapped.reserve(value.toTensorList().size());
    for (const at::Tensor& t : value.toTensorList()) mapped.push_back(fn(t));
    return mapped;
  }
  if (value.isList()) {
    const auto list = value.toList();
    c10::impl::GenericList mapped(list.elementType());
    mapped.reserve(list.size());
    for (const c10::IValue& item : list) mapped.push_back(map_tensors(item, fn));
    return mapped;
  }
  return value;
}

template <typename Fn>
void for_each_tensor(const c10::IValue& value, Fn&& fn) {
  if (value.isTensor()) {
    fn(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) fn(t);
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toList()) for_each_tensor(item, fn);
  }
}

// The CPU aliases of one collective's max_device tensors, and the way back.
// Shared by the call and its Work: Gloo's thread completes the future while
// the caller may read result(), hence the lock.
class Aliases {
 public:
  explicit Aliases(c10::DeviceIndex device) : device_(device) {}

  at::Tensor to_cpu(const at::Tensor& t) {
    std::lock_guard lock(mutex_);
    return is_device_tensor(t) ? scope_.to_cpu(t) : t;
  }

  c10::IValue to_device(const c10::IValue& value) {
    std::lock_guard lock(mutex_);
    device::CurrentDeviceScope on(device_);
    return map_tensors(value, [&](const at::Tensor& t) { return scope_.to_device(t); });
  }

 private:
  std::mutex mutex_;
  c10::DeviceIndex device_;
  device::HostAliasScope scope_;
};

// A backend's Work whose result() and future give max_device tensors.
class DeviceWork : public c10d::Work {
 public:
  DeviceWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<Aliases> aliases)
      : c10d::Work(-1, inner->retrieveOpType()), inner_(std::move(inner)), aliases_(std::move(aliases)) {}

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override {
    return aliases_->to_device(c10::IValue(inner_->result())).toTensorVector();
  }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override { return inner_->wait(timeout); }
  void blockCurrentStream() override { inner_->blockCurrentStream(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto inner = inner_->getFuture();
    return inner->then([aliases = aliases_](c10::ivalue::Future& done) { return aliases->to_device(done.value()); },
                       inner->elementType());
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return inner_->getFutureResult(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<Aliases> aliases_;
};

void collective_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  const size_t first = stack->size() - num_args;

  std::optional<c10::Device> device;  // of the first max_device tensor
  std::optional<c10::Device> other;   // of the first tensor on another device
  for (size_t i = first; i < stack->size(); ++i) {
    for_each_tensor((*stack)[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (is_device_tensor(t)) {
        if (!device) device = t.device();
      } else if (!other) {
        other = t.device();
      }
    });
  }
  if (!device) {
    op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect),
                       stack);
    return;
  }
  TORCH_CHECK_VALUE(!other, c10::toString(op.operator_name()), " got tensors on ", *device, " and ", *other,
                    ": every tensor of a collective on ", device->type(),
                    " must be a max_device tensor (move the others with .to(\"", device->type(), "\"))");

  auto aliases = std::make_shared<Aliases>(device->index());
  for (size_t i = first; i < stack->size(); ++i) {
    (*stack)[i] = map_tensors((*stack)[i], [&](const at::Tensor& t) { return aliases->to_cpu(t); });
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);

  const size_t num_returns = op.schema().returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    c10::IValue& value = (*stack)[i];
    if (value.isCustomClass()) {  // the Work
      value = c10::intrusive_ptr<c10d::Work>(
          c10::make_intrusive<DeviceWork>(value.toCustomClass<c10d::Work>(), aliases));
    } else {
      value = aliases->to_device(value);
    }
  }
}

}  // namespace
}  // namespace maxdev::dispatch

TORCH_LIBRARY_IMPL(c10d, BackendSelect, m) {
  for (const char* name : maxdev::dispatch::kCollectiveOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&maxdev::dispatch::collective_kernel>());
  }
}
