#include "dispatch/kernel_provider.h"

#include "dispatch/host_api.h"

namespace maxdev::dispatch {
namespace {

// The converted arguments of one call; everything points into the IValues
// on the stack or into this frame, so it lives exactly as long as the call.
class CallFrame {
 public:
  CallFrame(const OpSignature& sig, c10::ArrayRef<c10::IValue> args) {
    values_.resize(sig.args.size());
    for (size_t i = 0; i < sig.args.size(); ++i) convert(sig.args[i], args[i], values_[i]);
    // Pointers into the growable buffers are taken only now that they are full.
    size_t next_tensor = 0, next_int = 0, next_float = 0;
    for (size_t i = 0; i < sig.args.size(); ++i) fix_pointers(values_[i], next_tensor, next_int, next_float);
  }
  const maxdev_value* data() const { return values_.data(); }
  int32_t size() const { return static_cast<int32_t>(values_.size()); }
  const maxdev_tensor* tensor_of(size_t arg) const { return values_[arg].u.tensor; }

 private:
  void convert(const ArgPlan& plan, const c10::IValue& v, maxdev_value& out) {
    out.flags = plan.kind == ArgKind::scalar ? MAXDEV_VALUE_FLAG_SCALAR : 0u;
    if (v.isNone()) {
      out.kind = MAXDEV_VALUE_NONE;
      return;
    }
    switch (plan.kind) {
      case ArgKind::tensor:
        out.kind = MAXDEV_VALUE_TENSOR;
        tensors_.push_back(tensor_view(v.toTensor(), plan.written));
        return;
      case ArgKind::tensor_list: {
        out.kind = MAXDEV_VALUE_TENSOR_LIST;
        const auto list = v.toTensorList();
        out.u.tensor_list.size = static_cast<int64_t>(list.size());
        for (const at::Tensor& t : list) tensors_.push_back(tensor_view(t, plan.written));
        return;
      }
      case ArgKind::int_:
        out.kind = MAXDEV_VALUE_INT;
        out.u.i = v.toInt();
        return;
      case ArgKind::float_:
        out.kind = MAXDEV_VALUE_FLOAT;
        out.u.f = v.toDouble();
        return;
      case ArgKind::bool_:
        out.kind = MAXDEV_VALUE_BOOL;
        out.u.b = v.toBool() ? 1 : 0;
        return;
      case ArgKind::scalar:
        if (v.isBool()) {
          out.kind = MAXDEV_VALUE_BOOL;
          out.u.b = v.toBool() ? 1 : 0;
        } else if (v.isInt()) {
          out.kind = MAXDEV_VALUE_INT;
          out.u.i = v.toInt();
        } else {
          out.kind = MAXDEV_VALUE_FLOAT;  // complex scalars are declined before conversion
          out.u.f = v.toDouble();
        }
        return;
      case ArgKind::int_list: {
        out.kind = MAXDEV_VALUE_INT_LIST;
        const auto list = v.toIntList();
        out.u.int_list.size = static_cast<int64_t>(list.size());
        for (int64_t x : list) ints_.push_back(x);
        return;
      }
      case ArgKind::float_list: {
        out.kind = MAXDEV_VALUE_FLOAT_LIST;
        const auto list = v.toDoubleList();
        out.u.float_list.size = static_cast<int64_t>(list.size());
        for (double x : list) floats_.push_back(x);
        return;
      }
      case ArgKind::string:
        out.kind = MAXDEV_VALUE_STRING;
        out.u.string = v.toStringRef().c_str();
        return;
      case ArgKind::dtype:
        out.kind = MAXDEV_VALUE_DTYPE;
        to_abi_dtype(static_cast<c10::ScalarType>(v.toInt()), &out.u.dtype);
        return;
    }
  }

  void fix_pointers(maxdev_value& out, size_t& next_tensor, size_t& next_int, size_t& next_float) {
    switch (out.kind) {
      case MAXDEV_VALUE_TENSOR: out.u.tensor = &tensors_[next_tensor++]; break;
      case MAXDEV_VALUE_TENSOR_LIST:
        out.u.tensor_list.data = tensors_.data() + next_tensor;
        next_tensor += static_cast<size_t>(out.u.tensor_list.size);
        break;
      case MAXDEV_VALUE_INT_LIST:
        out.u.int_list.data = ints_.data() + next_int;
        next_int += static_cast<size_t>(out.u.int_list.size);
        break;
      case MAXDEV_VALUE_FLOAT_LIST:
        out.u.float_list.data = floats_.data() + next_float;
        next_float += static_cast<size_t>(out.u.float_list.size);
        break;
      default: break;
    }
  }

  c10::SmallVector<maxdev_value, 8> values_;
  c10::SmallVector<maxdev_tensor, 8> tensors_;
  c10::SmallVector<int64_t, 8> ints_;
  c10::SmallVector<double, 2> floats_;
};

template <typename Fn>
bool all_tensors(c10::ArrayRef<c10::IValue> args, Fn&& ok) {
  for (const auto& v : args) {
    if (v.isTensor()) {
      if (!ok(v.toTensor())) return false;
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (!ok(t)) return false;
      }
    }
  }
  return true;
}

}  // namespace

KernelProvider::KernelProvider(std::shared_ptr<const KernelOwner> owner, const maxdev_kernel_def& kernel)
    : Provider(owner->owner, "plugin"),
      owner_(std::move(owner)),
      fn_(kernel.fn),
      dtypes_(kernel.dtypes),
      flags_(kernel.flags) {}

bool KernelProvider::accepts(const OpSlot& slot, c10::ArrayRef<c10::IValue> args) const {
  std::optional<c10::ScalarType> first_dtype;
  const bool ok = all_tensors(args, [&](const at::Tensor& t) {
    if (!t.defined()) return true;
    const auto type = t.device().type();
    if (type != c10::DeviceType::PrivateUse1 && type != c10::DeviceType::CPU) return false;
    if (type == c10::DeviceType::CPU && (flags_ & MAXDEV_KERNEL_NO_CPU_TENSORS)) return false;
    if (t.layout() != c10::kStrided || t.is_conj() || t.is_neg()) return false;
    const uint64_t bit = dtype_mask_bit(t.scalar_type());
    if (bit == 0 || (dtypes_ != 0 && (dtypes_ & bit) == 0)) return false;
    if ((flags_ & MAXDEV_KERNEL_CONTIGUOUS_ONLY) && !t.is_contiguous()) return false;
    if (flags_ & MAXDEV_KERNEL_SAME_DTYPE) {
      if (first_dtype && *first_dtype != t.scalar_type()) return false;
      first_dtype = t.scalar_type();
    }
    return true;
  });
  if (!ok) return false;
  // Complex Scalars have no ABI value.
  for (size_t i = 0; i < slot.sig.args.size(); ++i) {
    if (slot.sig.args[i].kind == ArgKind::scalar && args[i].isComplexDouble()) return false;
  }
  return true;
}

bool KernelProvider::run(const OpSlot& slot, torch::jit::Stack* stack) {
  const OpSignature& sig = slot.sig;
  const auto args = torch::jit::last(*stack, sig.args.size());
  if (!accepts(slot, args)) {
    declines.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  CallFrame frame(sig, args);

  maxdev_host_context ctx;
  ctx.plugin = &owner_->plugin;
  ctx.sig = &sig;
  const size_t num_outputs = sig.return_aliases.size();
  ctx.outputs.resize(num_outputs);
  ctx.output_views.resize(num_outputs);
  ctx.output_ptrs.resize(num_outputs, nullptr);
  ctx.output_aliased.resize(num_outputs, false);
  for (size_t i = 0; i < num_outputs; ++i) {
    const int alias = sig.return_aliases[i];
    if (alias >= 0) {
      ctx.output_aliased[i] = true;
      ctx.output_ptrs[i] = frame.tensor_of(static_cast<size_t>(alias));
    }
  }

  const maxdev_call call{sizeof(maxdev_call), host_api(), &ctx, owner_->state, frame.data(), frame.size(),
                         static_cast<int32_t>(num_outputs), ctx.output_ptrs.data()};
  owner_->in_flight.fetch_add(1, std::memory_order_relaxed);
  const maxdev_status status = fn_(&call);
  owner_->in_flight.fetch_sub(1, std::memory_order_relaxed);

  if (status == MAXDEV_DECLINED) {
    declines.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  calls.fetch_add(1, std::memory_order_relaxed);
  if (status != MAXDEV_OK) {
    throw_kernel_error(*owner_, slot.name,
                       status == MAXDEV_ERROR ? (ctx.error.empty() ? "failed without a message" : ctx.error)
                                              : "returned an unknown status " + std::to_string(status));
  }
  c10::SmallVector<c10::IValue, 2> returns;
  for (size_t i = 0; i < num_outputs; ++i) {
    const int alias = sig.return_aliases[i];
    if (alias >= 0) {
      returns.push_back(args[static_cast<size_t>(alias)]);
    } else if (ctx.outputs[i].defined()) {
      returns.push_back(std::move(ctx.outputs[i]));
    } else {
      throw_kernel_error(*owner_, slot.name,
                         "returned success without allocating output " + std::to_string(i));
    }
  }
  torch::jit::drop(*stack, sig.args.size());
  for (auto& r : returns) stack->push_back(std::move(r));
  return true;
}

namespace {
std::atomic<KernelErrorHook> kernel_error_hook{nullptr};
}  // namespace

void set_kernel_error_hook(KernelErrorHook hook) { kernel_error_hook = hook; }

void throw_kernel_error(const KernelOwner& owner, const std::string& op, const std::string& message) {
  if (auto hook = kernel_error_hook.load()) hook(owner.plugin, op, owner.file, message);
  TORCH_CHECK(false, "plugin '", owner.plugin, "', op ", op, " (", owner.file, "): ", message);
}

}  // namespace maxdev::dispatch
