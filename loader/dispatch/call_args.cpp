#include "dispatch/call_args.h"

#include <c10/util/Exception.h>

#include <cstdint>

#include "device/allocator.h"
#include "dispatch/host_api.h"
#include "dispatch/op_table.h"

namespace maxdev::dispatch {
namespace {

// Before finish(), a value's pointer holds the offset of its first element
// in the frame's buffer of that type.
template <class T>
const T* offset_as_pointer(size_t offset) {
  return reinterpret_cast<const T*>(static_cast<uintptr_t>(offset));
}
template <class T>
size_t pointer_as_offset(const T* p) {
  return static_cast<size_t>(reinterpret_cast<uintptr_t>(p));
}

}  // namespace

CallArgs::CallArgs(const OpSlot& slot, c10::ArrayRef<c10::IValue> boxed) : slot_(slot), boxed_(boxed) {
  for (size_t i = 0; i < boxed.size(); ++i) add_boxed(boxed[i], i);
  finish();
}

void CallArgs::add_boxed(const c10::IValue& v, size_t arg) {
  const ArgPlan& plan = slot_.sig.args[arg];
  if (v.isNone()) {
    next_value(plan.kind == ArgKind::scalar ? MAXDEV_VALUE_FLAG_SCALAR : 0u).kind = MAXDEV_VALUE_NONE;
    return;
  }
  switch (plan.kind) {
    case ArgKind::tensor: return add(v.toTensor());
    case ArgKind::tensor_list: {
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_TENSOR_LIST;
      out.u.tensor_list.data = offset_as_pointer<maxdev_tensor>(views_.size());
      const auto list = v.toListRef();  // borrowed: the IValues outlive the call
      out.u.tensor_list.size = static_cast<int64_t>(list.size());
      for (const c10::IValue& t : list) add_view(t.toTensor(), plan.written);
      return;
    }
    case ArgKind::int_: return add(v.toInt());
    case ArgKind::float_: return add(v.toDouble());
    case ArgKind::bool_: return add(v.toBool());
    case ArgKind::scalar: return add(v.toScalar());
    case ArgKind::int_list: {
      const auto list = v.toIntList();
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_INT_LIST;
      out.u.int_list.data = offset_as_pointer<int64_t>(ints_.size());
      out.u.int_list.size = static_cast<int64_t>(list.size());
      for (int64_t x : list) ints_.push_back(x);
      return;
    }
    case ArgKind::float_list: {
      const auto list = v.toDoubleList();
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_FLOAT_LIST;
      out.u.float_list.data = offset_as_pointer<double>(floats_.size());
      out.u.float_list.size = static_cast<int64_t>(list.size());
      for (double x : list) floats_.push_back(x);
      return;
    }
    case ArgKind::bool_list: {
      const auto list = v.toBoolList();
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_BOOL_LIST;
      out.u.bool_list.data = offset_as_pointer<uint8_t>(bools_.size());
      out.u.bool_list.size = static_cast<int64_t>(list.size());
      for (bool x : list) bools_.push_back(x ? 1 : 0);
      return;
    }
    case ArgKind::string: {
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_STRING;
      out.u.string = v.toStringRef().c_str();  // NUL-terminated, lives as long as the IValue
      return;
    }
    case ArgKind::dtype: return add(static_cast<at::ScalarType>(v.toInt()));
  }
}

maxdev_value& CallArgs::next_value(uint32_t flags) {
  maxdev_value& out = values_.emplace_back();
  out.flags = flags;
  return out;
}

void CallArgs::add_view(const at::Tensor& t, bool written) {
  const c10::TensorImpl& impl = *t.unsafeGetTensorImpl();
  const c10::Device device = impl.device();
  if (device.type() == c10::DeviceType::PrivateUse1) {
    const c10::DeviceIndex index = device.index();
    TORCH_CHECK(device_index_ < 0 || device_index_ == index,
                "Expected all tensors to be on the same device, but found at least two devices, ",
                c10::Device(c10::DeviceType::PrivateUse1, device_index_), " and ", device, "! (in ", slot_.name,
                ")");
    device_index_ = index;
  } else if (device.is_cpu()) {
    traits_.on_cpu = true;
  } else {
    traits_.off_device = true;
  }
  tensors_.push_back(&t);
  maxdev_tensor& view = views_.emplace_back();
  if (impl.layout() != c10::kStrided || !impl.has_storage() || impl.is_conj() || impl.is_neg()) {
    passable_ = false;
    return;
  }
  const uint64_t dtype_bit = fill_tensor_view(impl, written, view);
  traits_.dtypes |= dtype_bit;
  traits_.contiguous = traits_.contiguous && impl.is_contiguous();
  if (dtype_bit == 0) passable_ = false;  // no ABI dtype: the CPU kernel serves it
  // Before any provider runs, so that none counts a call or a decline.
  if (C10_UNLIKELY(view.data == nullptr)) {
    try {
      device::check_allocated(impl, view.data);
    } catch (c10::Error& e) {
      const size_t arg = values_.size() - 1;
      e.add_context("argument '" + slot_.op.schema().arguments()[arg].name() + "' of " + slot_.name);
      throw;
    }
  }
}

void CallArgs::add(const at::Tensor& t) {
  maxdev_value& out = next_value();
  if (!t.defined()) {
    out.kind = MAXDEV_VALUE_NONE;
    return;
  }
  out.kind = MAXDEV_VALUE_TENSOR;
  out.u.tensor = offset_as_pointer<maxdev_tensor>(views_.size());
  add_view(t, slot_.sig.args[values_.size() - 1].written);
}

void CallArgs::add(const c10::Scalar& s) {
  maxdev_value& out = next_value(MAXDEV_VALUE_FLAG_SCALAR);
  if (s.isBoolean()) {
    out.kind = MAXDEV_VALUE_BOOL;
    out.u.b = s.toBool() ? 1 : 0;
  } else if (s.isIntegral(false)) {
    out.kind = MAXDEV_VALUE_INT;
    out.u.i = s.toLong();
  } else if (s.isComplex()) {
    out.kind = MAXDEV_VALUE_NONE;
    passable_ = false;
  } else {
    out.kind = MAXDEV_VALUE_FLOAT;
    out.u.f = s.toDouble();
  }
}

void CallArgs::add(int64_t i) {
  maxdev_value& out = next_value();
  out.kind = MAXDEV_VALUE_INT;
  out.u.i = i;
}

void CallArgs::add(bool b) {
  maxdev_value& out = next_value();
  out.kind = MAXDEV_VALUE_BOOL;
  out.u.b = b ? 1 : 0;
}

void CallArgs::add(double f) {
  maxdev_value& out = next_value();
  out.kind = MAXDEV_VALUE_FLOAT;
  out.u.f = f;
}

void CallArgs::add(at::ScalarType type) {
  maxdev_value& out = next_value();
  out.kind = MAXDEV_VALUE_DTYPE;
  to_abi_dtype(type, &out.u.dtype);
}

void CallArgs::add(std::optional<at::ScalarType> type) {
  if (type) return add(*type);
  next_value().kind = MAXDEV_VALUE_NONE;
}

void CallArgs::add(at::OptionalIntArrayRef list) {
  maxdev_value& out = next_value();
  if (!list) {
    out.kind = MAXDEV_VALUE_NONE;
    return;
  }
  out.kind = MAXDEV_VALUE_INT_LIST;
  out.u.int_list.data = offset_as_pointer<int64_t>(ints_.size());
  out.u.int_list.size = static_cast<int64_t>(list->size());
  ints_.append(list->begin(), list->end());
}

void CallArgs::add(c10::string_view s) {
  maxdev_value& out = next_value();
  out.kind = MAXDEV_VALUE_STRING;
  out.u.string = offset_as_pointer<char>(strings_.size());
  strings_.append(s.data(), s.size());
  strings_.push_back('\0');
}

void CallArgs::finish() {
  for (maxdev_value& v : values_) {
    switch (v.kind) {
      case MAXDEV_VALUE_TENSOR: v.u.tensor = views_.data() + pointer_as_offset(v.u.tensor); break;
      case MAXDEV_VALUE_TENSOR_LIST:
        v.u.tensor_list.data = views_.data() + pointer_as_offset(v.u.tensor_list.data);
        break;
      case MAXDEV_VALUE_INT_LIST: v.u.int_list.data = ints_.data() + pointer_as_offset(v.u.int_list.data); break;
      case MAXDEV_VALUE_FLOAT_LIST:
        v.u.float_list.data = floats_.data() + pointer_as_offset(v.u.float_list.data);
        break;
      case MAXDEV_VALUE_BOOL_LIST:
        v.u.bool_list.data = bools_.data() + pointer_as_offset(v.u.bool_list.data);
        break;
      case MAXDEV_VALUE_STRING:
        if (box_ != nullptr) v.u.string = strings_.data() + pointer_as_offset(v.u.string);
        break;
      default: break;
    }
  }
}

c10::ArrayRef<c10::IValue> CallArgs::boxed() const {
  if (box_ == nullptr) return boxed_;
  if (boxed_storage_.empty()) box_(cpp_args_, boxed_storage_);
  return boxed_storage_;
}

}  // namespace maxdev::dispatch
