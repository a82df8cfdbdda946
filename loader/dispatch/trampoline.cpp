#include "dispatch/trampoline.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/op_registration/infer_schema.h>
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

template <class Fn>
class UnboxedTrampoline;

// Called by the dispatcher with the op's C++ arguments. A `Tensor&` return
// is the op's one written argument (in-place self, out=).
template <class Ret, class... Args>
class UnboxedTrampoline<Ret(Args...)> final : public c10::OperatorKernel {
 public:
  static constexpr std::array<bool, sizeof...(Args)> kWritten = {std::is_same_v<Args, at::Tensor&>...};
  static constexpr int kWrittenIndex = [] {
    for (size_t i = 0; i < kWritten.size(); ++i) {
      if (kWritten[i]) return static_cast<int>(i);
    }
    return -1;
  }();
  static_assert(std::is_same_v<Ret, at::Tensor> || (std::is_same_v<Ret, at::Tensor&> && kWrittenIndex >= 0));

  explicit UnboxedTrampoline(const OpSlot* slot) : slot_(slot) {}

  Ret operator()(Args... args) {
    const OpSlot& slot = slot_.get();
    const auto refs = std::forward_as_tuple(args...);
    CallArgs call(slot, &box, &refs);
    (call.add(args), ...);
    call.finish();
    device::CurrentDeviceScope on_device(call.device_index());
    Returns returns;
    if (!serve(call, returns)) {
      const auto boxed = call.boxed();
      torch::jit::Stack stack(boxed.begin(), boxed.end());
      serve_on_cpu(slot, &stack);
      returns.assign(std::make_move_iterator(stack.begin()), std::make_move_iterator(stack.end()));
    }
    if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      return std::get<kWrittenIndex>(refs);
    } else {
      return std::move(returns[0]).toTensor();
    }
  }

  // CallArgs::BoxFn for the tuple of references operator() passes.
  static void box(const void* refs, torch::jit::Stack& out) {
    std::apply([&](const auto&... arg) { (out.emplace_back(arg), ...); },
               *static_cast<const std::tuple<Args&...>*>(refs));
  }

  // Whether the dispatcher would call this with exactly the op's C++
  // signature: the same types, a `Tensor&` for every written tensor, and a
  // return that is new (Tensor) or the written argument (Tensor&).
  static bool matches(const OpSlot& slot) {
    const c10::FunctionSchema& schema = slot.op.schema();
    if (schema.arguments().size() != sizeof...(Args) || schema.returns().size() != 1) return false;
    if (c10::findSchemaDifferences(c10::inferFunctionSchemaFlattenedReturns<Ret(Args...)>(), schema)) {
      return false;
    }
    for (size_t i = 0; i < sizeof...(Args); ++i) {
      const c10::Argument& a = schema.arguments()[i];
      // SymInts reach a kernel through a conversion the C++ signature hides.
      if (a.real_type()->str().find("SymInt") != std::string::npos) return false;
      const bool written = a.alias_info() != nullptr && a.alias_info()->isWrite();
      if (written != kWritten[i]) return false;
    }
    const int alias = slot.sig.return_aliases[0];
    return std::is_same_v<Ret, at::Tensor&> ? alias == kWrittenIndex : alias < 0;
  }

  static c10::RegistrationHandleRAII register_for(const OpSlot* slot) {
    return c10::Dispatcher::singleton().registerImpl(
        slot->op.operator_name(), c10::DispatchKey::PrivateUse1,
        c10::KernelFunction::makeFromUnboxedFunctor<false, UnboxedTrampoline>(
            std::make_unique<UnboxedTrampoline>(slot)),
        c10::impl::CppSignature::make<Ret(Args...)>(),
        std::make_unique<c10::FunctionSchema>(c10::inferFunctionSchemaFlattenedReturns<Ret(Args...)>()),
        "max_device unboxed trampoline");
  }

 private:
  SlotRef slot_;
};

using at::Scalar;
using at::Tensor;
using OptDims = at::OptionalIntArrayRef;
using OptDtype = std::optional<at::ScalarType>;

// The signatures served unboxed: the per-call cost of the ops a plugin
// serves most (elementwise, reductions, softmax, GEMM) in their functional,
// in-place and out= forms.
template <class... Fns>
struct SignatureList {};
using UnboxedSignatures = SignatureList<
    Tensor(const Tensor&), Tensor&(Tensor&), Tensor&(const Tensor&, Tensor&),                      // unary
    Tensor(const Tensor&, const Tensor&), Tensor&(Tensor&, const Tensor&),                           // binary
    Tensor&(const Tensor&, const Tensor&, Tensor&),                                                  //
    Tensor(const Tensor&, const Tensor&, const Scalar&), Tensor&(Tensor&, const Tensor&, const Scalar&),  // alpha
    Tensor&(const Tensor&, const Tensor&, const Scalar&, Tensor&),                                   //
    Tensor(const Tensor&, const Scalar&), Tensor&(Tensor&, const Scalar&),                           // scalar
    Tensor&(const Tensor&, const Scalar&, Tensor&),                                                  //
    Tensor(const Tensor&, OptDims, bool, OptDtype), Tensor&(const Tensor&, OptDims, bool, OptDtype, Tensor&),  // sum, mean
    Tensor(const Tensor&, int64_t, bool), Tensor&(const Tensor&, int64_t, bool, Tensor&),            // _softmax
    Tensor(const Tensor&, const Tensor&, int64_t, at::ScalarType),                                   // its backward
    Tensor&(const Tensor&, const Tensor&, int64_t, at::ScalarType, Tensor&),                         //
    Tensor(const Tensor&, c10::string_view), Tensor&(Tensor&, c10::string_view),                     // gelu
    Tensor&(const Tensor&, c10::string_view, Tensor&),                                               //
    Tensor(const Tensor&, const Tensor&, const Tensor&, const Scalar&, const Scalar&),               // addmm
    Tensor&(const Tensor&, const Tensor&, const Tensor&, const Scalar&, const Scalar&, Tensor&)>;

// The dispatcher refuses a kernel whose C++ signature differs from one
// already registered for the op (a native kernel's, generated from the same
// schema): such an op keeps the boxed trampoline.
template <class... Fns>
std::optional<c10::RegistrationHandleRAII> register_unboxed(const OpSlot* slot, SignatureList<Fns...>) {
  std::optional<c10::RegistrationHandleRAII> handle;
  auto attempt = [&](auto matches, auto register_for) {
    if (handle || !matches(*slot)) return;
    try {
      handle.emplace(register_for(slot));
    } catch (const c10::Error& e) {
      log::debug("no unboxed trampoline for " + slot->name + ": " + e.what_without_backtrace());
    }
  };
  (attempt(&UnboxedTrampoline<Fns>::matches, &UnboxedTrampoline<Fns>::register_for), ...);
  return handle;
}

}  // namespace

c10::RegistrationHandleRAII register_trampoline(OpSlot* slot, bool* unboxed) {
  if (auto handle = register_unboxed(slot, UnboxedSignatures{})) {
    *unboxed = true;
    return std::move(*handle);
  }
  *unboxed = false;
  return c10::Dispatcher::singleton().registerImpl(
      slot->op.operator_name(), c10::DispatchKey::PrivateUse1,
      c10::KernelFunction::makeFromBoxedKernel(
          c10::BoxedKernel::makeFromFunctor(std::make_unique<BoxedTrampoline>(slot))),
      std::nullopt, nullptr, "max_device boxed trampoline");
}

}  // namespace maxdev::dispatch
