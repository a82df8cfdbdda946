// One call's arguments as every provider of the op sees them, converted
// once per call, not once per provider: the ABI's values, with borrowed
// DLPack-layout views of the tensors, in inline buffers that live as long
// as the call; the argument tensors themselves, borrowed (no refcount
// traffic); and the boxed IValues. The boxed trampoline has those already;
// the unboxed one converts its C++ arguments straight into the ABI values
// and boxes them only when a provider asks (Python overrides, kernel
// checks) or every provider declined (the CPU fallback).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/Scalar.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/SmallVector.h>
#include <max_device/plugin.h>

#include <optional>
#include <string>
#include <string_view>

namespace maxdev::dispatch {

struct OpSlot;

class CallArgs {
 public:
  // Boxes the C++ arguments of an unboxed call on demand.
  using BoxFn = void (*)(const void* args, torch::jit::Stack& out);

  // From the boxed arguments of the op (the schema's, in order).
  CallArgs(const OpSlot& slot, c10::ArrayRef<c10::IValue> boxed);
  // For an unboxed call: `add` each C++ argument in schema order, then
  // finish(). `box(args, ...)` boxes them when a provider asks.
  CallArgs(const OpSlot& slot, BoxFn box, const void* args) : slot_(slot), box_(box), cpp_args_(args) {}
  CallArgs(const CallArgs&) = delete;
  CallArgs& operator=(const CallArgs&) = delete;

  void add(const at::Tensor& t);
  void add(const c10::Scalar& s);
  void add(int64_t i);
  void add(bool b);
  void add(double f);
  void add(at::ScalarType type);
  void add(std::optional<at::ScalarType> type);
  void add(at::OptionalIntArrayRef list);
  void add(c10::string_view s);
  // Points the values at the filled buffers (they may have moved while
  // growing); the ABI values are valid from here on.
  void finish();

  const OpSlot& slot() const { return slot_; }
  const maxdev_value* values() const { return values_.data(); }
  int32_t size() const { return static_cast<int32_t>(values_.size()); }
  // Every tensor argument (lists flattened, None left out), in order.
  c10::ArrayRef<const at::Tensor*> tensors() const { return tensors_; }
  // The tensor of argument `arg` (a Tensor argument that is not None).
  const at::Tensor& tensor_of(size_t arg) const { return *tensors_[view_index(arg)]; }
  const maxdev_tensor* view_of(size_t arg) const { return values_[arg].u.tensor; }
  // Whether every argument has an ABI value: false for a complex Scalar,
  // and a tensor that is not strided, has no storage, has its conj or neg
  // bit set, or a dtype the ABI has no code for. (A tensor whose storage
  // has no bytes yet is an error while adding it.)
  // Plugins cannot take such a call.
  bool passable() const { return passable_; }
  // The max_device device of the call's tensors (-1: none is on one).
  // Tensors on two devices are an error, raised while adding them.
  c10::DeviceIndex device_index() const { return device_index_; }

  // What a kernel's declared capabilities are checked against, gathered
  // while the tensors are added: once per call, not once per provider.
  struct TensorTraits {
    uint64_t dtypes = 0;         // MAXDEV_DTYPE_* bits of the tensors' dtypes, or-ed
    bool contiguous = true;      // every tensor is contiguous
    bool on_cpu = false;         // some tensor is a CPU tensor
    bool off_device = false;     // some tensor is neither on max_device nor on the CPU
    // Two tensors of different dtypes: each dtype has its own bit.
    bool mixed_dtypes() const { return (dtypes & (dtypes - 1)) != 0; }
  };
  // Meaningful for a passable() call.
  const TensorTraits& tensor_traits() const { return traits_; }

  // The boxed arguments.
  c10::ArrayRef<c10::IValue> boxed() const;

 private:
  size_t view_index(size_t arg) const { return static_cast<size_t>(values_[arg].u.tensor - views_.data()); }
  maxdev_value& next_value(uint32_t flags = 0);
  void add_view(const at::Tensor& t, bool written);
  void add_boxed(const c10::IValue& v, size_t arg);

  const OpSlot& slot_;
  c10::ArrayRef<c10::IValue> boxed_;
  BoxFn box_ = nullptr;
  const void* cpp_args_ = nullptr;
  mutable torch::jit::Stack boxed_storage_;  // what box_ made

  c10::SmallVector<maxdev_value, 8> values_;
  // Until finish(), the pointers in values_ hold offsets into these buffers.
  c10::SmallVector<maxdev_tensor, 8> views_;
  c10::SmallVector<const at::Tensor*, 8> tensors_;
  c10::SmallVector<int64_t, 8> ints_;
  c10::SmallVector<double, 2> floats_;
  c10::SmallVector<uint8_t, 4> bools_;
  std::string strings_;  // each NUL-terminated, for string_view arguments
  bool passable_ = true;
  c10::DeviceIndex device_index_ = -1;
  TensorTraits traits_;
};

}  // namespace maxdev::dispatch
