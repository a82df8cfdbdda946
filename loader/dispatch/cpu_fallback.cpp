#include "dispatch/cpu_fallback.h"

#include <ATen/native/CPUFallback.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "common/log.h"
#include "device/allocator.h"
#include "device/generator.h"
#include "device/host_alias.h"
#include "dispatch/op_table.h"
#include "dispatch/unboxed_signatures.h"

namespace maxdev::dispatch {
namespace {

using device::HostAliasScope;
using device::is_device_tensor;

constexpr int8_t kNoOverride = -1;

struct OpEntry {
  std::string name;
  std::string served_by;  // its profiler range
  OpEntry* base = nullptr;  // "aten::mm" for "aten::mm.out": its policy covers every overload
  std::atomic<int64_t> count{0};
  std::atomic<int8_t> policy{kNoOverride};
  std::atomic<bool> warned{false};
};

class FallbackRegistry {
 public:
  // Out of line: registry(), on every fallback call, stays a guard check.
  C10_NOINLINE FallbackRegistry() {
    if (const char* env = std::getenv("MAX_DEVICE_FALLBACK")) configure(env);
  }

  // Fast path, on every fallback call: a lock-free probe of an
  // open-addressing table keyed by the operator's address. Entries are
  // added under the lock and never removed.
  OpEntry& entry(const c10::OperatorHandle& op) {
    const void* key = &op.operator_name();
    if (OpEntry* e = find(key)) return *e;
    std::unique_lock lock(mutex_);
    if (OpEntry* e = find(key)) return *e;
    const auto& name = op.operator_name();
    OpEntry& e = named(c10::toString(name));
    if (!name.overload_name.empty()) e.base = &named(name.name);
    for (size_t i = home(key), probes = 0; probes < kSlots; i = (i + 1) % kSlots, ++probes) {
      if (slots_[i].key.load(std::memory_order_relaxed) != nullptr) continue;
      slots_[i].entry.store(&e, std::memory_order_relaxed);
      slots_[i].key.store(key, std::memory_order_release);  // publishes the entry
      return e;
    }
    return e;  // more ops than slots (none of PyTorch's builds): found by name under the lock
  }

  void set_override(const std::string& op, std::optional<FallbackPolicy> policy) {
    std::unique_lock lock(mutex_);
    OpEntry& e = named(op);
    e.policy = policy ? static_cast<int8_t>(*policy) : kNoOverride;
    e.warned = false;
  }

  template <typename Fn>
  void for_each(Fn&& fn) {
    std::shared_lock lock(mutex_);
    for (auto& [name, e] : by_name_) fn(*e);
  }

  std::atomic<FallbackPolicy> global{FallbackPolicy::allow};
  std::atomic<FallbackImpl> impl{FallbackImpl::zero_copy};

 private:
  // MAX_DEVICE_FALLBACK="warn" or "allow,aten::mm=error,aten::add.out=warn".
  void configure(const std::string& spec) {
    std::stringstream items(spec);
    std::string item;
    while (std::getline(items, item, ',')) {
      if (item.empty()) continue;
      try {
        const auto eq = item.find('=');
        if (eq == std::string::npos) {
          global = parse_policy(item);
        } else {
          set_override(item.substr(0, eq), parse_policy(item.substr(eq + 1)));
        }
      } catch (const std::invalid_argument& e) {
        log::error(std::string("MAX_DEVICE_FALLBACK: ") + e.what() + "; entry '" + item +
                   "' ignored");
      }
    }
  }

  OpEntry& named(const std::string& name) {
    auto& slot = by_name_[name];
    if (!slot) {
      slot = std::make_unique<OpEntry>();
      slot->name = name;
      slot->served_by = served_by_name(name, "cpu fallback");
    }
    return *slot;
  }

  static constexpr size_t kSlots = 8192;  // PyTorch defines ~3,600 aten overloads
  struct Slot {
    std::atomic<const void*> key{nullptr};
    std::atomic<OpEntry*> entry{nullptr};
  };
  static size_t home(const void* key) {
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(key) >> 4) * 0x9E3779B97F4A7C15ull >> 51) % kSlots;
  }
  OpEntry* find(const void* key) {
    for (size_t i = home(key), probes = 0; probes < kSlots; i = (i + 1) % kSlots, ++probes) {
      const void* k = slots_[i].key.load(std::memory_order_acquire);
      if (k == key) return slots_[i].entry.load(std::memory_order_relaxed);
      if (k == nullptr) break;
    }
    return nullptr;
  }

  std::shared_mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<OpEntry>> by_name_;
  std::unique_ptr<Slot[]> slots_ = std::make_unique<Slot[]>(kSlots);
};

FallbackRegistry& registry() {
  static FallbackRegistry instance;
  return instance;
}

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

bool is_write(const c10::Argument& arg) {
  return arg.alias_info() != nullptr && arg.alias_info()->isWrite();
}

// Applies the policy for `op` and counts the call; throws under `error`.
OpEntry& note_fallback(const c10::OperatorHandle& op);

void fallback_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (registry().impl.load(std::memory_order_relaxed) == FallbackImpl::copying) {
    ServedBy range(note_fallback(op).served_by);
    at::native::cpu_fallback(op, stack);
    return;
  }
  fall_back(op, stack);
}

}  // namespace

FallbackPolicy parse_policy(const std::string& name) {
  if (name == "allow") return FallbackPolicy::allow;
  if (name == "warn") return FallbackPolicy::warn;
  if (name == "error") return FallbackPolicy::error;
  throw std::invalid_argument("unknown fallback policy '" + name +
                              "' (expected 'allow', 'warn' or 'error')");
}

const char* policy_name(FallbackPolicy policy) {
  switch (policy) {
    case FallbackPolicy::allow: return "allow";
    case FallbackPolicy::warn: return "warn";
    case FallbackPolicy::error: return "error";
  }
  return "?";
}

void set_fallback_policy(FallbackPolicy policy) {
  registry().global = policy;
  registry().for_each([](OpEntry& e) { e.warned = false; });
}

FallbackPolicy fallback_policy() { return registry().global; }

void set_op_fallback_policy(const std::string& op, std::optional<FallbackPolicy> policy) {
  registry().set_override(op, policy);
}

std::vector<std::pair<std::string, FallbackPolicy>> op_fallback_policies() {
  std::vector<std::pair<std::string, FallbackPolicy>> out;
  registry().for_each([&](OpEntry& e) {
    if (e.policy != kNoOverride) out.emplace_back(e.name, static_cast<FallbackPolicy>(e.policy.load()));
  });
  return out;
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::vector<std::pair<std::string, int64_t>> out;
  registry().for_each([&](OpEntry& e) {
    if (e.count > 0) out.emplace_back(e.name, e.count.load());
  });
  return out;
}

void reset_fallback_counts() {
  registry().for_each([](OpEntry& e) { e.count = 0; });
}

void set_fallback_impl(FallbackImpl impl) { registry().impl = impl; }

namespace {

OpEntry& note_fallback(const c10::OperatorHandle& op) {
  FallbackRegistry& fallbacks = registry();
  OpEntry& e = fallbacks.entry(op);
  if (!staged_on_this_thread()) e.count.fetch_add(1, std::memory_order_relaxed);
  int8_t own = e.policy.load(std::memory_order_relaxed);
  if (own == kNoOverride && e.base != nullptr) own = e.base->policy.load(std::memory_order_relaxed);
  const auto policy = own == kNoOverride ? fallbacks.global.load(std::memory_order_relaxed)
                                         : static_cast<FallbackPolicy>(own);
  if (policy == FallbackPolicy::allow) return e;
  if (policy == FallbackPolicy::error) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, "max_device: ", e.name,
        " has no max_device kernel and would run on the CPU fallback, which the fallback "
        "policy forbids ('error'). Load a plugin that serves it, or allow it with "
        "max_device.set_fallback_policy('allow', op='",
        e.name, "').");
  }
  if (!e.warned.exchange(true)) {
    TORCH_WARN("max_device: ", e.name,
               " has no max_device kernel; it runs on the CPU fallback (zero copy). "
               "This is reported once per op; see max_device.fallback_counts().");
  }
  return e;
}

}  // namespace

void fall_back(const c10::OperatorHandle& op, torch::jit::Stack* stack, CpuKernel cpu_kernel) {
  ServedBy range(note_fallback(op).served_by);
  run_cpu_kernel(op, stack, cpu_kernel);
}

namespace {

// The CPU side of one fallback call: each max_device tensor argument
// becomes a CPU alias over its bytes (all on one device, as on CUDA), and
// what the CPU kernel returns or resized becomes max_device tensors again.
class CpuCall {
 public:
  explicit CpuCall(const c10::OperatorHandle& op) : op_(op) {}

  // What the CPU kernel gets for tensor argument `t` (schema argument `arg`).
  at::Tensor pass(const at::Tensor& t, bool written, const c10::Argument& arg) {
    if (!check(t, arg)) return t;
    try {
      return scope_.to_cpu(t, written);
    } catch (c10::Error& e) {
      e.add_context("argument '" + arg.name() + "' of " + c10::toString(op_.operator_name()));
      throw;
    }
  }

  // Notes the device of tensor argument `t`; whether it is a device tensor.
  bool check(const at::Tensor& t, const c10::Argument& arg) {
    if (!is_device_tensor(t)) {
      if (t.defined() && t.device().is_cpu() && t.dim() > 0 && cpu_operand_ == nullptr) cpu_operand_ = &arg;
      return false;
    }
    if (!aliased_) {
      device_ = t.device();
      aliased_ = true;
    } else {
      TORCH_CHECK(device_ == t.device(),
                  "Expected all tensors to be on the same device, but found at least two devices, ", device_, " and ",
                  t.device(), "! (in ", c10::toString(op_.operator_name()), ")");
    }
    return true;
  }

  // After every argument: a CPU tensor among device tensors is an error
  // (0-dim scalars and indices excepted, as PyTorch allows on any device).
  void check_operands() const {
    TORCH_CHECK(cpu_operand_ == nullptr || !aliased_ || cpu_operand_->name() == "indices",
                "Expected all tensors to be on the same device, but found at least two devices, ", device_,
                " and cpu! (argument '", cpu_operand_ ? cpu_operand_->name() : "", "' of ",
                c10::toString(op_.operator_name()), ")");
  }

  // The device outputs, grown buffers and the default generator belong to:
  // the tensors', else `otherwise` (a factory's device= argument, or -1:
  // the current device).
  c10::DeviceIndex device_index(c10::DeviceIndex otherwise) const {
    return aliased_ ? device_.index() : otherwise;
  }

  // Once the kernel returned: grown buffers and changed geometry reach the
  // written device tensors.
  void finish() {
    scope_.commit();
    scope_.sync_back_written();
  }

  // A returned tensor as a max_device tensor (after finish()).
  at::Tensor result(const at::Tensor& t) {
    // The README promises no quantized tensors on max_device: a CPU kernel
    // that made one (quantize_per_tensor, ...) is refused here, not adopted
    // as a device tensor on which every later op fails.
    TORCH_CHECK_NOT_IMPLEMENTED(!t.is_quantized(), "max_device does not support quantized tensors: ",
                                c10::toString(op_.operator_name()), " would return a ", t.scalar_type(),
                                " tensor; quantize on the CPU instead");
    return scope_.to_device(t);
  }

 private:
  const c10::OperatorHandle& op_;
  HostAliasScope scope_;
  bool aliased_ = false;  // a device tensor was checked: device_ is the call's
  c10::Device device_{device::kDeviceType};
  const c10::Argument* cpu_operand_ = nullptr;  // a CPU tensor that is not a 0-dim scalar
};

}  // namespace

void run_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, CpuKernel cpu_kernel) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t num_args = arguments.size();
  const size_t first = stack->size() - num_args;

  CpuCall call(op);
  c10::DeviceIndex device_argument = -1;
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& value = (*stack)[first + i];
    const bool written = is_write(arguments[i]);
    if (value.isTensor()) {
      value = call.pass(value.toTensor(), written, arguments[i]);
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> cpu_list;
      for (const at::Tensor& t : value.toTensorList()) cpu_list.push_back(call.pass(t, written, arguments[i]));
      value = std::move(cpu_list);
    } else if (value.isOptionalTensorList()) {
      static const c10::Argument kIndices("indices");
      c10::List<std::optional<at::Tensor>> cpu_list;
      for (const c10::IValue& item : value.toListRef()) {
        cpu_list.push_back(item.isTensor() ? std::optional<at::Tensor>(call.pass(item.toTensor(), written, kIndices))
                                           : std::nullopt);
      }
      value = std::move(cpu_list);
    } else if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
      // Factories that reach the fallback allocate on the CPU; the result
      // is adopted below.
      device_argument = value.toDevice().index();
      value = c10::Device(c10::kCPU);
    }
  }
  call.check_operands();
  device::CurrentDeviceScope on_device(call.device_index(device_argument));
  for (size_t i = 0; i < num_args; ++i) {
    if (!is_optional_generator(arguments[i])) continue;
    c10::IValue& value = (*stack)[first + i];
    value = device::cpu_engine(value.isNone() ? std::nullopt : value.toOptional<at::Generator>());
  }

  if (cpu_kernel != nullptr) {
    cpu_kernel(stack);
  } else {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

  call.finish();
  const size_t num_returns = schema.returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    c10::IValue& value = (*stack)[i];
    if (value.isTensor()) {
      value = call.result(value.toTensor());
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> device_list;
      for (const at::Tensor& t : value.toTensorList()) device_list.push_back(call.result(t));
      value = std::move(device_list);
    }
  }
}

namespace {

// The fused optimizers, whose CPU kernels read and write the tensors of
// their lists only through data pointers (and item() for a step count): on
// max_device tensors, which are host memory, they compute as on the CPU.
// Their fallback passes the lists as they are, as a CUDA kernel gets them:
// a step over a model's parameters aliased four lists of them one by one
// (test_zero_copy checks every op of the list against the CPU).
bool is_pointer_op(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> kPointerOps = {"aten::_fused_adam_", "aten::_fused_adamw_",
                                                              "aten::_fused_sgd_", "aten::_fused_adagrad_"};
  return kPointerOps.count(name.name) != 0;
}

// The fallback of an op whose C++ signature is one of UnboxedSignatures or
// PointerSignatures, called unboxed: the arguments stay C++ values, the CPU
// kernel is called unboxed, no stack is allocated. What it computes,
// counts, checks and throws is the boxed fallback's (run_cpu_kernel), which
// it shares.
template <class Fn>
class UnboxedFallback;

template <class Ret, class... Args>
class UnboxedFallback<Ret(Args...)> final : public c10::OperatorKernel {
 public:
  using Sig = Signature<Ret(Args...)>;

  explicit UnboxedFallback(const c10::OperatorHandle& op) : op_(op), cpu_(op.typed<Ret(Args...)>()) {}

  Ret operator()(Args... args) {
    if (registry().impl.load(std::memory_order_relaxed) == FallbackImpl::copying) return boxed(args...);
    return run(std::index_sequence_for<Args...>{}, args...);
  }

  // A return that is new (Tensor: no alias at all, not a view) or the
  // written argument (Tensor&).
  static bool matches(const c10::OperatorHandle& op) {
    if (!Sig::matches(op.schema())) return false;
    if constexpr ((std::is_same_v<Args, at::TensorList> || ...)) {
      if (!is_pointer_op(op.operator_name())) return false;  // its lists would need aliases
    }
    if constexpr (std::is_void_v<Ret>) {
      return true;
    } else if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      const c10::AliasInfo* ret = op.schema().returns()[0].alias_info();
      const c10::AliasInfo* written = op.schema().arguments()[Sig::kWrittenIndex].alias_info();
      return ret != nullptr && ret->isWrite() && ret->beforeSets() == written->beforeSets();
    } else {
      return op.schema().returns()[0].alias_info() == nullptr;
    }
  }

  static SharedKernel make(const c10::OperatorHandle& op) {
    return Sig::shared_kernel(std::make_unique<UnboxedFallback>(op), "max_device unboxed CPU fallback");
  }

 private:
  template <size_t... I>
  Ret run(std::index_sequence<I...>, Args... args) {
    ServedBy range(note_fallback(op_).served_by);
    CpuCall call(op_);
    const auto& schema_args = op_.schema().arguments();
    std::tuple<OnCpu<Args>...> cpu{pass<Args>(call, args, Sig::kWritten[I], schema_args[I])...};
    call.check_operands();
    device::CurrentDeviceScope on_device(call.device_index(-1));
    const auto cpu_kernel = [&](auto&... a) -> Ret {
      return cpu_.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), a...);
    };
    if constexpr (std::is_void_v<Ret>) {
      std::apply(cpu_kernel, cpu);
      call.finish();
    } else if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      std::apply(cpu_kernel, cpu);
      call.finish();
      return std::get<Sig::kWrittenIndex>(std::forward_as_tuple(args...));
    } else {
      at::Tensor result = std::apply(cpu_kernel, cpu);
      call.finish();
      return call.result(result);
    }
  }

  // A tensor argument's CPU alias is a tensor of its own (an optional
  // tensor's, an optional); a tensor list (a pointer op's) passes checked
  // as it came, like the other arguments.
  template <class A>
  using OnCpu = std::conditional_t<std::is_same_v<std::decay_t<A>, at::Tensor>, at::Tensor,
                                   std::conditional_t<std::is_same_v<std::decay_t<A>, std::optional<at::Tensor>>,
                                                      std::optional<at::Tensor>, A>>;

  template <class A>
  static OnCpu<A> pass(CpuCall& call, const std::remove_reference_t<A>& arg, bool written,
                       const c10::Argument& schema_arg) {
    if constexpr (std::is_same_v<std::decay_t<A>, at::Tensor>) {
      return call.pass(arg, written, schema_arg);
    } else if constexpr (std::is_same_v<std::decay_t<A>, std::optional<at::Tensor>>) {
      return arg.has_value() ? std::optional<at::Tensor>(call.pass(*arg, written, schema_arg)) : std::nullopt;
    } else if constexpr (std::is_same_v<A, at::TensorList>) {
      for (const at::Tensor& t : arg) call.check(t, schema_arg);
      return arg;
    } else {
      return arg;
    }
  }

  // PyTorch's copying fallback (the benchmark's baseline) takes a stack.
  Ret boxed(Args... args) {
    torch::jit::Stack stack;
    stack.reserve(sizeof...(Args));
    (stack.emplace_back(args), ...);
    fallback_kernel(op_, &stack);
    if constexpr (std::is_void_v<Ret>) {
      return;
    } else if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      return std::get<Sig::kWrittenIndex>(std::forward_as_tuple(args...));
    } else {
      return std::move(stack[0]).toTensor();
    }
  }

  c10::OperatorHandle op_;
  c10::TypedOperatorHandle<Ret(Args...)> cpu_;
};

}  // namespace

namespace {

// PyTorch sends convolutions on devices other than the CPU and CUDA to
// convolution_overrideable, whose default kernel only throws: max_device
// runs them as the CPU's convolution, zero copy like every fallback.
void cpu_convolution(torch::jit::Stack* stack) {
  auto a = torch::jit::pop(*stack, 9);
  torch::jit::push(*stack, at::convolution(a[0].toTensor(), a[1].toTensor(), a[2].toOptional<at::Tensor>(),
                                           a[3].toIntVector(), a[4].toIntVector(), a[5].toIntVector(),
                                           a[6].toBool(), a[7].toIntVector(), a[8].toInt()));
}

void cpu_convolution_backward(torch::jit::Stack* stack) {
  auto a = torch::jit::pop(*stack, 10);
  const at::Tensor& weight = a[2].toTensor();
  const bool transposed = a[6].toBool();
  const int64_t groups = a[8].toInt();
  const auto mask = a[9].to<std::array<bool, 3>>();
  const std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
      a[0].toTensor(), a[1].toTensor(), weight, mask[2] ? std::optional<at::IntArrayRef>(bias_sizes) : std::nullopt,
      a[3].toIntVector(), a[4].toIntVector(), a[5].toIntVector(), transposed, a[7].toIntVector(), groups, mask);
  torch::jit::push(*stack, grad_input, grad_weight, grad_bias);
}

template <CpuKernel kernel>
void fallback_via(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fall_back(op, stack, kernel);
}

}  // namespace

namespace {

// The out= overload a structured form's composite calls: an overload of the
// same name (add for add_) with the form's arguments, in order and of the
// same types, followed by written arguments only.
std::optional<c10::OperatorName> structured_delegate(const c10::FunctionSchema& form,
                                                     const std::vector<c10::OperatorHandle>& overloads) {
  const auto& args = form.arguments();
  std::optional<c10::OperatorName> found;
  for (const auto& candidate : overloads) {
    const auto& out_args = candidate.schema().arguments();
    if (out_args.size() <= args.size()) continue;
    bool match = true;
    for (size_t i = 0; match && i < out_args.size(); ++i) {
      match = i < args.size() ? out_args[i].name() == args[i].name() && *out_args[i].type() == *args[i].type()
                              : is_write(out_args[i]) && out_args[i].kwarg_only();
    }
    if (!match) continue;
    if (found) return std::nullopt;  // ambiguous: leave the form to the composite
    found = candidate.operator_name();
  }
  return found;
}

class DirectFallbacks {
 public:
  DirectFallbacks() {
    auto& dispatcher = c10::Dispatcher::singleton();
    std::unordered_map<std::string, std::vector<c10::OperatorHandle>> by_name;
    std::vector<c10::OperatorHandle> forms, others;
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      const auto op = dispatcher.findOp(name);
      if (!op) continue;
      by_name[name.name].push_back(*op);
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) || is_native_device_op(c10::toString(name))) {
        continue;
      }
      if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
        forms.push_back(*op);
      } else if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
                 !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
        others.push_back(*op);  // reaches the boxed fallback: unboxed if its signature allows
      }
    }
    for (const auto& form : forms) {
      std::string base = form.operator_name().name;
      if (base.back() == '_') base.pop_back();  // add_ -> add
      const auto delegate = structured_delegate(form.schema(), by_name[base]);
      if (!delegate) continue;
      const std::string name = c10::toString(form.operator_name());
      add(name, form, /*form=*/true);
      const std::string out = c10::toString(*delegate);
      auto it = forms_of_.find(out);
      if (it == forms_of_.end()) it = forms_of_.emplace(out, Delegate{*dispatcher.findOp(*delegate), {}}).first;
      it->second.forms.push_back(name);
    }
    for (const auto& op : others) add(c10::toString(op.operator_name()), op, /*form=*/false);
  }

  std::vector<std::string> ops() {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [name, registration] : by_op_) out.push_back(name);
    return out;
  }

  bool has(const std::string& op) {
    std::lock_guard lock(mutex_);
    return by_op_.count(op) != 0;
  }

  void end(const std::string& op) {
    std::lock_guard lock(mutex_);
    end_locked(op);
  }

  void suspend() {
    std::lock_guard lock(mutex_);
    for (auto& [name, registration] : by_op_) suspended_.push_back({name, registration.op, registration.form});
    by_op_.clear();
  }

  void resume() {
    std::lock_guard lock(mutex_);
    std::vector<std::string> served;
    for (const auto& s : suspended_) {
      if (s.op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
        served.push_back(s.name);
      } else {
        add(s.name, s.op, s.form);
      }
    }
    suspended_.clear();
    for (const auto& [out, delegate] : forms_of_) {
      if (by_op_.count(out) == 0 && delegate.op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
        served.push_back(out);
      }
    }
    for (const auto& op : served) end_locked(op);
  }

 private:
  // The fallback kernel of `op`: unboxed where its signature allows (a
  // pointer op's too); else
  // boxed for a form, while an op that reaches the boxed fallback anyway
  // gets none.
  void add(const std::string& name, const c10::OperatorHandle& op, bool form) {
    std::optional<c10::RegistrationHandleRAII> handle;
    if (auto kept = kernels_.find(name); kept != kernels_.end()) {  // resumed
      try {
        handle.emplace(kept->second.register_for(op));
      } catch (const c10::Error& e) {  // the library registered a conflicting signature: boxed fallback
        log::debug("no fallback kernel resumed for " + name + ": " + e.what_without_backtrace());
      }
    } else {
      auto made = register_unboxed<UnboxedFallback>(op, op, name, UnboxedSignatures{});
      if (!made && is_pointer_op(op.operator_name())) {
        made = register_unboxed<UnboxedFallback>(op, op, name, PointerSignatures{});
      }
      if (!made && form) {
        made.emplace(register_kernel(SharedKernel(c10::KernelFunction::makeFromBoxedFunction<&fallback_kernel>(),
                                                  std::nullopt, std::nullopt, "max_device direct CPU fallback"),
                                     op));
      }
      if (made) {
        handle.emplace(std::move(made->registration));
        kernels_.emplace(name, std::move(made->kernel));
      }
    }
    if (handle) by_op_.emplace(name, Registration{op, std::move(*handle), form});
  }

  void end_locked(const std::string& op) {
    by_op_.erase(op);
    if (auto it = forms_of_.find(op); it != forms_of_.end()) {
      for (const auto& form : it->second.forms) by_op_.erase(form);
      forms_of_.erase(it);
    }
  }

  std::mutex mutex_;
  // Each op's kernel, made once: ending or suspending a registration never
  // frees it under a call on another thread (dispatch/shared_kernel.h).
  std::unordered_map<std::string, SharedKernel> kernels_;
  struct Registration {
    c10::OperatorHandle op;
    c10::RegistrationHandleRAII handle;
    bool form;
  };
  std::unordered_map<std::string, Registration> by_op_;
  struct Delegate {
    c10::OperatorHandle op;          // aten::add.out
    std::vector<std::string> forms;  // aten::add.Tensor, aten::add_.Tensor
  };
  std::unordered_map<std::string, Delegate> forms_of_;
  struct Suspended {
    std::string name;
    c10::OperatorHandle op;
    bool form;
  };
  std::vector<Suspended> suspended_;
};

DirectFallbacks& direct_fallbacks() {
  static DirectFallbacks instance;
  return instance;
}

}  // namespace

std::vector<std::string> direct_fallback_ops() { return direct_fallbacks().ops(); }
bool is_direct_fallback(const std::string& op) { return direct_fallbacks().has(op); }
void end_direct_fallbacks(const std::string& op) { direct_fallbacks().end(op); }
void suspend_direct_fallbacks() { direct_fallbacks().suspend(); }
void resume_direct_fallbacks() { direct_fallbacks().resume(); }

void register_fallback(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback_kernel>());
}

void register_cpu_kernel_routes(torch::Library& m) {
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&fallback_via<&cpu_convolution>>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&fallback_via<&cpu_convolution_backward>>());
  // Ops with a CPU kernel of their own and a CompositeExplicitAutograd
  // kernel for every other backend, which would take precedence over the
  // fallback and compute differently: run the CPU's kernel instead, so a
  // model computes what it computes on the CPU, bit for bit. (The list is
  // every such aten op in torch 2.13; tests/python/test_cpu_routes.py checks
  // that none is missing.) native_layer_norm and native_group_norm would
  // decompose through native_batch_norm, where the CPU's kernels accumulate
  // float16/bfloat16 inputs in float; addr would run math_addr. Layer norm's
  // route is its trampoline's no-provider path, so a plugin kernel can serve
  // it too. Two composites that every backend shares, the CPU included, run
  // as the CPU's through the fallback too: conj_physical_'s calls a
  // DispatchStub, which has no max_device kernel; addr_'s passes one C++
  // tensor as self and out=, which addr.out's CPU kernel tells apart by
  // address, an identity the boxed fallback's two stack entries lose.
  OpTable::instance().route_to_cpu_kernel("aten::native_layer_norm");
  for (const char* op : {"native_group_norm", "addr", "addr.out", "addr_", "_stack", "_stack.out", "all.dims_out",
                         "any.dims_out", "linalg__powsum", "conj_physical_"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&fallback_kernel>());
  }
  direct_fallbacks();
}

}  // namespace maxdev::dispatch

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { maxdev::dispatch::register_fallback(m); }
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { maxdev::dispatch::register_cpu_kernel_routes(m); }
