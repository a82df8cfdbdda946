#include "dispatch/trampoline.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/core/Scalar.h>

#include <array>
#include <optional>
#include <tuple>
#include <type_traits>

#include "common/log.h"
#include "device/allocator.h"
#include "dispatch/call_args.h"
#include "dispatch/cpu_fallback.h"
#include "dispatch/epoch.h"
#include "dispatch/op_table.h"
#include "dispatch/unboxed_signatures.h"

namespace maxdev::dispatch {
namespace {

// Runs the providers of the call's op, top first; true when one served it.
bool serve(const CallArgs& args, Returns& returns) {
  ReadGuard guard;
  const DispatchTable* table = OpTable::instance().current();
  const size_t index = args.slot().index;
  if (index >= table->stacks.size()) return false;
  const ProviderStack& providers = table->stacks[index];
  for (auto it = providers.rbegin(); it != providers.rend(); ++it) {
    if ((*it)->run(args, returns)) return true;
  }
  return false;
}

// Every provider declined: PyTorch's CPU kernel on the stack's arguments.
void serve_on_cpu(const OpSlot& slot, torch::jit::Stack* stack) {
  if (!slot.has_cpu_kernel) {
    const auto [plugin, file] = slot.unserved();
    if (!plugin.empty()) {
      throw_call_error("unserved", plugin, slot.name, file,
                       "the plugin that served this op was unloaded, and nothing else serves it; load a "
                       "plugin that serves it (the op's schema stays defined for the life of the process)");
    }
  }
  TORCH_CHECK_NOT_IMPLEMENTED(slot.has_cpu_kernel, "max_device: no provider of ", slot.name,
                              " accepted these arguments and it has no CPU kernel to fall back to "
                              "(see max_device.list_ops() for its providers and their declines)");
  fall_back(slot.op, stack);
}

// The trampoline's reference to its slot. The dispatcher hands kernels to
// other threads through a table it reads without synchronization; the
// release/acquire pair orders the slot's construction before any call.
class SlotRef {
 public:
  explicit SlotRef(const OpSlot* slot) { slot_.store(slot, std::memory_order_release); }
  const OpSlot& get() const { return *slot_.load(std::memory_order_acquire); }

 private:
  std::atomic<const OpSlot*> slot_;
};

class BoxedTrampoline final : public c10::OperatorKernel {
 public:
  explicit BoxedTrampoline(const OpSlot* slot) : slot_(slot) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const OpSlot& slot = slot_.get();
    const size_t n = slot.sig.args.size();
    const auto args = torch::jit::last(*stack, n);
    const CallArgs call(slot, args);
    // Plugin outputs are allocated on the device of the call.
    device::CurrentDeviceScope on_device(call.device_index());
    Returns returns;
    if (!serve(call, returns)) return serve_on_cpu(slot, stack);
    for (size_t i = 0; i < returns.size(); ++i) {
      const int alias = slot.sig.return_aliases[i];
      if (alias >= 0) returns[i] = args[static_cast<size_t>(alias)];
    }
    torch::jit::drop(*stack, n);
    for (auto& r : returns) stack->push_back(std::move(r));
  }

 private:
  SlotRef slot_;
};

// What an unboxed string argument takes of CallArgs' string buffer (its
// bytes and a NUL); nothing for the other types.
template <class T>
size_t string_bytes(const T&) {
  return 0;
}
size_t string_bytes(c10::string_view s) { return s.size() + 1; }

// Adds one C++ argument of type Arg: a `Tensor&` is one the op writes.
template <class Arg>
void add_arg(CallArgs& call, const std::remove_reference_t<Arg>& value) {
  if constexpr (std::is_same_v<std::decay_t<Arg>, at::Tensor>) {
    call.add(value, std::is_same_v<Arg, at::Tensor&>);
  } else {
    call.add(value);
  }
}

template <class Fn>
class UnboxedTrampoline;

// Called by the dispatcher with the op's C++ arguments. A `Tensor&` return
// is the op's one written argument (in-place self, out=).
template <class Ret, class... Args>
class UnboxedTrampoline<Ret(Args...)> final : public c10::OperatorKernel {
 public:
  using Sig = Signature<Ret(Args...)>;
  // An unboxed call's values and tensor views stay in CallArgs' inline
  // buffers, which it does not reserve.
  static_assert(sizeof...(Args) <= CallArgs::kInlineValues &&
                (size_t{std::is_same_v<std::decay_t<Args>, at::Tensor>} + ... + 0) <= CallArgs::kInlineTensors);

  explicit UnboxedTrampoline(const OpSlot* slot) : slot_(slot) {}

  Ret operator()(Args... args) {
    const OpSlot& slot = slot_.get();
    const auto refs = std::forward_as_tuple(args...);
    CallArgs call(slot, &box, &refs, (string_bytes(args) + ... + size_t{0}));
    (add_arg<Args>(call, args), ...);
    device::CurrentDeviceScope on_device(call.device_index());
    Returns returns;
    if (!serve(call, returns)) {
      const auto boxed = call.boxed();
      torch::jit::Stack stack(boxed.begin(), boxed.end());
      serve_on_cpu(slot, &stack);
      returns.assign(std::make_move_iterator(stack.begin()), std::make_move_iterator(stack.end()));
    }
    if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      return std::get<Sig::kWrittenIndex>(refs);
    } else {
      return std::move(returns[0]).toTensor();
    }
  }

  // CallArgs::BoxFn for the tuple of references operator() passes.
  static void box(const void* refs, torch::jit::Stack& out) {
    std::apply([&](const auto&... arg) { (out.emplace_back(arg), ...); },
               *static_cast<const std::tuple<Args&...>*>(refs));
  }

  // The signature's, and a return that is new (Tensor) or the written
  // argument (Tensor&).
  static bool matches(const OpSlot* slot) {
    if (!Sig::matches(slot->op.schema())) return false;
    const int alias = slot->sig.return_aliases[0];
    return std::is_same_v<Ret, at::Tensor&> ? alias == Sig::kWrittenIndex : alias < 0;
  }

  static SharedKernel make(const OpSlot* slot) {
    return Sig::shared_kernel(std::make_unique<UnboxedTrampoline>(slot), "max_device unboxed trampoline");
  }

 private:
  SlotRef slot_;
};

}  // namespace

RegisteredKernel register_trampoline(OpSlot* slot, bool* unboxed) {
  if (auto registered =
          register_unboxed<UnboxedTrampoline>(slot->op, static_cast<const OpSlot*>(slot), slot->name, UnboxedSignatures{})) {
    *unboxed = true;
    return std::move(*registered);
  }
  *unboxed = false;
  return register_kernel(SharedKernel(c10::KernelFunction::makeFromBoxedKernel(c10::BoxedKernel::makeFromFunctor(
                                          std::make_unique<BoxedTrampoline>(slot))),
                                      std::nullopt, std::nullopt, "max_device boxed trampoline"),
                         slot->op);
}

}  // namespace maxdev::dispatch
