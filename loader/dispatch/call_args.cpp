#include "dispatch/call_args.h"

#include <c10/util/Exception.h>

#include <cstdint>

#include "device/allocator.h"
#include "dispatch/host_api.h"
#include "dispatch/op_table.h"

namespace maxdev::dispatch {

CallArgs::CallArgs(const OpSlot& slot, c10::ArrayRef<c10::IValue> boxed) : slot_(slot), boxed_(boxed) {
  reserve_for(boxed);
  for (size_t i = 0; i < boxed.size(); ++i) add_boxed(boxed[i], i);
}

void CallArgs::reserve_for(c10::ArrayRef<c10::IValue> boxed) {
  size_t tensors = 0, ints = 0, floats = 0, bools = 0;
  for (size_t i = 0; i < boxed.size(); ++i) {
    const c10::IValue& v = boxed[i];
    if (v.isNone()) continue;
    switch (slot_.sig.args[i].kind) {
      case ArgKind::tensor: ++tensors; break;
      case ArgKind::tensor_list: tensors += v.toListRef().size(); break;
      case ArgKind::int_list: ints += v.toListRef().size(); break;
      case ArgKind::float_list: floats += v.toListRef().size(); break;
      case ArgKind::bool_list: bools += v.toListRef().size(); break;
      default: break;
    }
  }
  values_.reserve(boxed.size(), heap_);
  views_.reserve(tensors, heap_);
  tensors_.reserve(tensors, heap_);
  ints_.reserve(ints, heap_);
  floats_.reserve(floats, heap_);
  bools_.reserve(bools, heap_);
}

void CallArgs::add_boxed(const c10::IValue& v, size_t arg) {
  const ArgPlan& plan = slot_.sig.args[arg];
  if (v.isNone()) {
    next_value(plan.kind == ArgKind::scalar ? MAXDEV_VALUE_FLAG_SCALAR : 0u).kind = MAXDEV_VALUE_NONE;
    return;
  }
  switch (plan.kind) {
    case ArgKind::tensor: return add(v.toTensor(), plan.written);
    case ArgKind::tensor_list: {
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_TENSOR_LIST;
      out.u.tensor_list.data = views_.end();
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
      const auto list = v.toListRef();
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_INT_LIST;
      out.u.int_list.data = ints_.end();
      out.u.int_list.size = static_cast<int64_t>(list.size());
      for (const c10::IValue& x : list) ints_.push() = x.toInt();
      return;
    }
    case ArgKind::float_list: {
      const auto list = v.toListRef();
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_FLOAT_LIST;
      out.u.float_list.data = floats_.end();
      out.u.float_list.size = static_cast<int64_t>(list.size());
      for (const c10::IValue& x : list) floats_.push() = x.toDouble();
      return;
    }
    case ArgKind::bool_list: {
      const auto list = v.toListRef();
      maxdev_value& out = next_value();
      out.kind = MAXDEV_VALUE_BOOL_LIST;
      out.u.bool_list.data = bools_.end();
      out.u.bool_list.size = static_cast<int64_t>(list.size());
      for (const c10::IValue& x : list) bools_.push() = x.toBool() ? 1 : 0;
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

void CallArgs::devices_differ(c10::Device device) const {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
              c10::Device(c10::DeviceType::PrivateUse1, device_index_), " and ", device, "! (in ", slot_.name, ")");
}

void CallArgs::check_allocated(const c10::TensorImpl& impl) const {
  try {
    device::check_allocated(impl, nullptr);
  } catch (c10::Error& e) {
    const size_t arg = values_.size() - 1;
    e.add_context("argument '" + slot_.op.schema().arguments()[arg].name() + "' of " + slot_.name);
    throw;
  }
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
  out.u.int_list.data = list->data();
  out.u.int_list.size = static_cast<int64_t>(list->size());
}

void CallArgs::add(c10::string_view s) {
  maxdev_value& out = next_value();
  out.kind = MAXDEV_VALUE_STRING;
  out.u.string = strings_.end();
  for (char c : s) strings_.push() = c;
  strings_.push() = '\0';
}

c10::ArrayRef<c10::IValue> CallArgs::boxed() const {
  if (box_ == nullptr) return boxed_;
  if (!heap_) heap_ = std::make_unique<ArgHeap>();
  if (heap_->boxed.empty()) box_(cpp_args_, heap_->boxed);
  return heap_->boxed;
}

}  // namespace maxdev::dispatch
