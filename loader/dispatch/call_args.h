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

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dispatch/host_api.h"

namespace maxdev::dispatch {

struct OpSlot;

// What a call's ArgBuffers allocate beyond their inline sizes, owned in
// one place: destroying a call that allocated nothing (a common one) checks
// one pointer, not one per buffer.
struct ArgHeap {
  std::vector<std::unique_ptr<std::byte[]>> blocks;
  torch::jit::Stack boxed;  // what CallArgs' BoxFn made
};

// The storage of one kind of ABI value for one call: sized once, before
// the first push, inline up to N elements (a common call allocates
// nothing), so elements never move and pushing checks nothing. T is a C
// struct of the ABI: a pushed element holds garbage until written.
template <class T, size_t N>
class ArgBuffer {
  static_assert(std::is_trivial_v<T> && alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);

 public:
  ArgBuffer() = default;
  ArgBuffer(const ArgBuffer&) = delete;
  ArgBuffer& operator=(const ArgBuffer&) = delete;

  // Once, before the first push; a block beyond N elements comes from (and
  // lives as long as) `heap`, made on first need.
  void reserve(size_t n, std::unique_ptr<ArgHeap>& heap) {
    if (n <= N) return;
    if (!heap) heap = std::make_unique<ArgHeap>();
    std::unique_ptr<std::byte[]> block(new std::byte[n * sizeof(T)]);
    data_ = reinterpret_cast<T*>(block.get());
    heap->blocks.push_back(std::move(block));
  }
  T& push() { return data_[size_++]; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T* end() { return data_ + size_; }
  size_t size() const { return size_; }
  const T& operator[](size_t i) const { return data_[i]; }
  operator c10::ArrayRef<T>() const { return {data_, size_}; }

 private:
  T inline_[N];  // left uninitialized: T is trivial
  T* data_ = inline_;
  size_t size_ = 0;
};

class CallArgs {
 public:
  // Boxes the C++ arguments of an unboxed call on demand.
  using BoxFn = void (*)(const void* args, torch::jit::Stack& out);

  // From the boxed arguments of the op (the schema's, in order).
  CallArgs(const OpSlot& slot, c10::ArrayRef<c10::IValue> boxed);
  // For an unboxed call: `add` each C++ argument in schema order.
  // `box(args, ...)` boxes them when a provider asks. `string_bytes`: the
  // sizes of the string arguments plus one each, reserved up front.
  CallArgs(const OpSlot& slot, BoxFn box, const void* args, size_t string_bytes)
      : slot_(slot), box_(box), cpp_args_(args) {
    strings_.reserve(string_bytes, heap_);
  }
  CallArgs(const CallArgs&) = delete;
  CallArgs& operator=(const CallArgs&) = delete;

  // Every buffer is reserved before the first add (the boxed constructor
  // counts; an unboxed call's tensors fit the inline buffers), so each ABI
  // value points at its final place as soon as it is added.
  // `written`: the schema marks the tensor written (in-place self, out=).
  void add(const at::Tensor& t, bool written);
  void add(const c10::Scalar& s);
  void add(int64_t i);
  void add(bool b);
  void add(double f);
  void add(at::ScalarType type);
  void add(std::optional<at::ScalarType> type);
  // Borrowed: the caller's list outlives the call.
  void add(at::OptionalIntArrayRef list);
  void add(c10::string_view s);

  // What an unboxed call may pass at most: its buffers are not reserved.
  static constexpr size_t kInlineValues = 8, kInlineTensors = 8;

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
  maxdev_value& next_value(uint32_t flags = 0) {
    maxdev_value& out = values_.push();
    out = maxdev_value{};
    out.flags = flags;
    return out;
  }
  void add_view(const at::Tensor& t, bool written);
  [[noreturn]] void devices_differ(c10::Device device) const;
  // Raises, naming the argument, unless the tensor has no bytes to hold.
  void check_allocated(const c10::TensorImpl& impl) const;
  void reserve_for(c10::ArrayRef<c10::IValue> boxed);
  void add_boxed(const c10::IValue& v, size_t arg);

  const OpSlot& slot_;
  c10::ArrayRef<c10::IValue> boxed_;
  BoxFn box_ = nullptr;
  const void* cpp_args_ = nullptr;

  ArgBuffer<maxdev_value, kInlineValues> values_;
  ArgBuffer<maxdev_tensor, kInlineTensors> views_;
  ArgBuffer<const at::Tensor*, kInlineTensors> tensors_;
  ArgBuffer<int64_t, 8> ints_;  // a boxed call's lists, copied
  ArgBuffer<double, 2> floats_;
  ArgBuffer<uint8_t, 4> bools_;
  ArgBuffer<char, 16> strings_;  // each NUL-terminated, for string_view arguments
  bool passable_ = true;
  c10::DeviceIndex device_index_ = -1;
  TensorTraits traits_;
  // Last, so destroyed first: the buffers that point into it destroy nothing.
  mutable std::unique_ptr<ArgHeap> heap_;
};

// Inline: the unboxed trampoline converts its tensors with these, per call.

C10_ALWAYS_INLINE void CallArgs::add_view(const at::Tensor& t, bool written) {
  const c10::TensorImpl& impl = *t.unsafeGetTensorImpl();
  const c10::Device device = impl.device();
  if (device.type() == c10::DeviceType::PrivateUse1) {
    if (C10_UNLIKELY(device_index_ >= 0 && device_index_ != device.index())) devices_differ(device);
    device_index_ = device.index();
  } else if (device.is_cpu()) {
    traits_.on_cpu = true;
  } else {
    traits_.off_device = true;
  }
  tensors_.push() = &t;
  maxdev_tensor& view = views_.push();
  // Storage tested directly: has_storage() is a virtual call that, for
  // every TensorImpl that is strided and not a wrapper, says the same.
  if (C10_UNLIKELY(impl.layout() != c10::kStrided || !impl.unsafe_storage() || impl.is_conj() || impl.is_neg())) {
    view = maxdev_tensor{};
    passable_ = false;
    return;
  }
  const uint64_t dtype_bit = fill_tensor_view(impl, written, view);
  traits_.dtypes |= dtype_bit;
  traits_.contiguous = traits_.contiguous && impl.is_contiguous();
  if (C10_UNLIKELY(dtype_bit == 0)) passable_ = false;  // no ABI dtype: the CPU kernel serves it
  // Before any provider runs, so that none counts a call or a decline.
  if (C10_UNLIKELY(view.data == nullptr)) check_allocated(impl);
}

C10_ALWAYS_INLINE void CallArgs::add(const at::Tensor& t, bool written) {
  maxdev_value& out = next_value();
  if (!t.defined()) {
    out.kind = MAXDEV_VALUE_NONE;
    return;
  }
  out.kind = MAXDEV_VALUE_TENSOR;
  out.u.tensor = views_.end();  // views_ does not move: reserved
  add_view(t, written);
}

}  // namespace maxdev::dispatch
