#include "dispatch/kernel_provider.h"

#include <ATen/EmptyTensor.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string_view>

#include "common/log.h"
#include "dispatch/host_api.h"

namespace maxdev::dispatch {
namespace {

std::atomic<bool> kernel_checks_enabled{[] {
  const char* env = std::getenv("MAX_DEVICE_CHECK_KERNELS");
  return env != nullptr && std::strcmp(env, "1") == 0;
}()};

// Hashes of the tensor arguments a kernel may only read, taken before the
// call and compared after it. Arguments that share storage with a written
// argument (e.g. neg.out(x, out=x)) may change legitimately and are left out.
class ReadOnlyDigests {
 public:
  ReadOnlyDigests(const OpSignature& sig, c10::ArrayRef<c10::IValue> args) {
    std::vector<c10::Storage> written;
    for (size_t i = 0; i < sig.args.size(); ++i) {
      if (sig.args[i].written) for_each_tensor(args[i], [&](const at::Tensor& t) { written.push_back(t.storage()); });
    }
    for (size_t i = 0; i < sig.args.size(); ++i) {
      if (sig.args[i].written) continue;
      for_each_tensor(args[i], [&](const at::Tensor& t) {
        for (const auto& w : written) {
          if (t.storage().is_alias_of(w)) return;
        }
        digests_.push_back({i, t, digest(t)});
      });
    }
  }

  // The first argument whose bytes changed, if any.
  std::optional<size_t> changed() const {
    for (const auto& d : digests_) {
      if (digest(d.tensor) != d.value) return d.arg;
    }
    return std::nullopt;
  }

 private:
  struct Digest {
    size_t arg;
    at::Tensor tensor;
    size_t value;
  };

  template <typename Fn>
  static void for_each_tensor(const c10::IValue& v, Fn&& fn) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().has_storage()) {
      fn(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (t.defined() && t.has_storage()) fn(t);
      }
    }
  }

  // Every byte from the first to the last element the tensor's strides reach.
  static size_t digest(const at::Tensor& t) {
    if (t.numel() == 0) return 0;
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    const auto bytes = static_cast<size_t>(last + 1) * t.dtype().itemsize();
    return std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(t.const_data_ptr()), bytes));
  }

  std::vector<Digest> digests_;
};

// A meta tensor with t's sizes, strides and dtype; symbolic sizes (traced
// with dynamic shapes) are specialized to their current values.
at::Tensor concrete_meta(const at::Tensor& t) {
  if (!t.defined()) return t;
  std::vector<int64_t> sizes, strides;
  for (int64_t d = 0; d < t.dim(); ++d) {
    sizes.push_back(t.sym_size(d).guard_int(__FILE__, __LINE__));
    strides.push_back(t.sym_stride(d).guard_int(__FILE__, __LINE__));
  }
  return at::detail::empty_strided_meta(sizes, strides, t.scalar_type());
}

c10::IValue to_meta(const c10::IValue& v) {
  if (v.isTensor()) return concrete_meta(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorList()) list.push_back(concrete_meta(t));
    return list;
  }
  return v;
}

// With kernel checks on: the read-only arguments are unchanged and the
// allocated outputs have the shapes and dtypes of the op's meta kernel.
void check_contract(const KernelOwner& owner, const OpSlot& slot, c10::ArrayRef<c10::IValue> args,
                    const maxdev_host_context& ctx, const ReadOnlyDigests& read_only) {
  if (const auto arg = read_only.changed()) {
    throw_kernel_error(owner, slot.name,
                       "wrote into argument " + std::to_string(*arg) + " (" +
                           slot.op.schema().arguments()[*arg].name() +
                           "), which its schema marks read-only (found by kernel checks)");
  }
  bool allocates = false;
  for (const auto& output : ctx.outputs) allocates = allocates || output.alias == nullptr;
  if (!allocates) return;
  const auto expected = meta_returns(slot, args);
  if (!expected) return;
  for (size_t i = 0; i < ctx.outputs.size(); ++i) {
    if (ctx.outputs[i].alias != nullptr || !(*expected)[i].isTensor()) continue;
    const at::Tensor& want = (*expected)[i].toTensor();
    const at::Tensor& got = ctx.outputs[i].allocated;
    if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) {
      throw_kernel_error(owner, slot.name,
                         "returned output " + std::to_string(i) + " as " + describe(got) + " where the op's meta "
                         "kernel gives " + describe(want) + " (found by kernel checks)");
    }
  }
}

// Counts a kernel call as in flight for as long as it runs, exceptions included.
struct InFlight {
  explicit InFlight(const KernelOwner& owner) : owner(owner) {
    owner.in_flight.fetch_add(1, std::memory_order_relaxed);
  }
  ~InFlight() { owner.in_flight.fetch_sub(1, std::memory_order_relaxed); }
  const KernelOwner& owner;
};

}  // namespace

void set_kernel_checks(bool enabled) { kernel_checks_enabled.store(enabled, std::memory_order_relaxed); }
bool kernel_checks() { return kernel_checks_enabled.load(std::memory_order_relaxed); }

KernelProvider::KernelProvider(std::shared_ptr<const KernelOwner> owner, const maxdev_kernel_def& kernel)
    : Provider(owner->owner, "plugin",
               served_by_name(kernel.op, owner->owner + " gen " + std::to_string(owner->generation))),
      owner_(std::move(owner)),
      fn_(kernel.fn),
      meta_(kernel.meta),
      backward_(kernel.backward != nullptr ? kernel.backward : ""),
      dtypes_(kernel.dtypes != 0 ? kernel.dtypes : ~uint64_t{0}),
      cpu_tensors_((kernel.flags & MAXDEV_KERNEL_NO_CPU_TENSORS) == 0),
      contiguous_only_((kernel.flags & MAXDEV_KERNEL_CONTIGUOUS_ONLY) != 0),
      same_dtype_((kernel.flags & MAXDEV_KERNEL_SAME_DTYPE) != 0) {}

namespace {

// The per-call context: one slot per return; an aliased return (in-place,
// out=) starts as the argument tensor it aliases, borrowed.
void prepare_outputs(maxdev_host_context& ctx, const OpSignature& sig, const CallArgs& args) {
  ctx.args = &args;
  for (const int alias : sig.return_aliases) {
    maxdev_host_context::Output& output = ctx.outputs.emplace_back();
    if (alias >= 0) output.alias = &args.tensor_of(static_cast<size_t>(alias));
    ctx.output_ptrs.push_back(alias >= 0 ? args.view_of(static_cast<size_t>(alias)) : nullptr);
  }
}

}  // namespace

bool KernelProvider::run_meta(const OpSlot& slot, torch::jit::Stack* stack) {
  if (meta_ == nullptr) return false;
  const OpSignature& sig = slot.sig;
  const auto args = torch::jit::last(*stack, sig.args.size());
  torch::jit::Stack concrete;
  for (const auto& v : args) concrete.push_back(to_meta(v));
  const CallArgs frame(slot, concrete);
  maxdev_host_context ctx;
  ctx.plugin = &owner_->plugin;
  ctx.sig = &sig;
  ctx.meta = true;
  prepare_outputs(ctx, sig, frame);
  const size_t num_outputs = sig.return_aliases.size();
  const maxdev_call call{sizeof(maxdev_call), host_api(), &ctx, owner_->state, frame.values(), frame.size(),
                         static_cast<int32_t>(num_outputs), ctx.output_ptrs.data()};
  maxdev_status status;
  try {
    InFlight in_flight(*owner_);
    status = meta_(&call);
  } catch (...) {
    throw_kernel_error(*owner_, slot.name, "its meta function threw a C++ exception across the C ABI");
  }
  if (status == MAXDEV_ERROR && ctx.input_error) std::rethrow_exception(ctx.input_error);
  if (status != MAXDEV_OK) {
    throw_kernel_error(*owner_, slot.name,
                       "its meta function " + std::string(status == MAXDEV_DECLINED ? "declined" : "failed") +
                           (ctx.error.empty() ? "" : ": " + ctx.error));
  }
  c10::SmallVector<c10::IValue, 2> returns;
  for (size_t i = 0; i < num_outputs; ++i) {
    const int alias = sig.return_aliases[i];
    if (alias < 0 && !ctx.outputs[i].allocated.defined()) {
      throw_kernel_error(*owner_, slot.name, "its meta function did not allocate output " + std::to_string(i));
    }
    returns.push_back(alias >= 0 ? args[static_cast<size_t>(alias)] : std::move(ctx.outputs[i].allocated));
  }
  torch::jit::drop(*stack, sig.args.size());
  for (auto& r : returns) stack->push_back(std::move(r));
  return true;
}

bool KernelProvider::accepts(const CallArgs& args) const {
  if (!args.passable()) return false;
  const CallArgs::TensorTraits& traits = args.tensor_traits();
  return !traits.off_device && (cpu_tensors_ || !traits.on_cpu) && (traits.dtypes & ~dtypes_) == 0 &&
         (!contiguous_only_ || traits.contiguous) && (!same_dtype_ || !traits.mixed_dtypes());
}

bool KernelProvider::run(const CallArgs& args, Returns& returns) {
  const OpSlot& slot = args.slot();
  const OpSignature& sig = slot.sig;
  if (!accepts(args)) {
    count_decline();
    return false;
  }
  maxdev_host_context ctx;
  ctx.plugin = &owner_->plugin;
  ctx.sig = &sig;
  prepare_outputs(ctx, sig, args);
  const size_t num_outputs = sig.return_aliases.size();

  const maxdev_call call{sizeof(maxdev_call), host_api(), &ctx, owner_->state, args.values(), args.size(),
                         static_cast<int32_t>(num_outputs), ctx.output_ptrs.data()};
  const bool checking = kernel_checks();
  std::optional<ReadOnlyDigests> read_only;
  if (checking) read_only.emplace(sig, args.boxed());
  maxdev_status status;
  try {
    InFlight in_flight(*owner_);
    ServedBy range(served_by());
    status = fn_(&call);
  } catch (const std::exception& e) {
    count_call();
    throw_kernel_error(*owner_, slot.name,
                       std::string("threw a C++ exception across the C ABI (wrap C++ kernels in "
                                   "MAXDEV_SDK_KERNEL): ") + e.what());
  } catch (...) {
    count_call();
    throw_kernel_error(*owner_, slot.name,
                       "threw a non-standard C++ exception across the C ABI (wrap C++ kernels in MAXDEV_SDK_KERNEL)");
  }

  if (status == MAXDEV_DECLINED) {
    count_decline();
    return false;
  }
  count_call();
  if (status == MAXDEV_ERROR && ctx.input_error) std::rethrow_exception(ctx.input_error);
  if (status != MAXDEV_OK) {
    throw_kernel_error(*owner_, slot.name,
                       status == MAXDEV_ERROR ? (ctx.error.empty() ? "failed without a message" : ctx.error)
                                              : "returned an unknown status " + std::to_string(status));
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    if (ctx.outputs[i].alias == nullptr && !ctx.outputs[i].allocated.defined()) {
      // outputs[i] is the host's to set: whatever the kernel put there is ignored.
      throw_kernel_error(*owner_, slot.name, "returned success without allocating output " + std::to_string(i));
    }
  }
  if (checking) check_contract(*owner_, slot, args.boxed(), ctx, *read_only);
  // Aliased returns are the trampoline's to make (Provider::run): None here.
  for (auto& output : ctx.outputs) {
    returns.emplace_back(output.alias != nullptr ? c10::IValue() : c10::IValue(std::move(output.allocated)));
  }
  return true;
}

void throw_kernel_error(const KernelOwner& owner, const std::string& op, const std::string& message) {
  throw_call_error("kernel", owner.plugin, op, owner.file, message);
}

std::string describe(const at::Tensor& t) {
  std::string out = std::string(c10::toString(t.scalar_type())) + "[";
  for (size_t d = 0; d < t.sizes().size(); ++d) out += (d ? ", " : "") + std::to_string(t.sizes()[d]);
  return out + "]";
}


std::optional<torch::jit::Stack> meta_returns(const OpSlot& slot, c10::ArrayRef<c10::IValue> args) {
  torch::jit::Stack stack;
  for (const auto& v : args) stack.push_back(to_meta(v));
  try {
    slot.op.callBoxed(&stack);
  } catch (const std::exception& e) {
    log::debug("kernel checks: no meta kernel result for " + slot.name + ": " + e.what());
    return std::nullopt;
  }
  return stack;
}


}  // namespace maxdev::dispatch
