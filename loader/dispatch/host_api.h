// The host side of the plugin ABI: the function table handed to plugins
// and the per-call context behind `maxdev_host_context`.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <max_device/plugin.h>

#include <array>
#include <exception>
#include <string>

#include "dispatch/op_signature.h"

namespace maxdev::dispatch {
class CallArgs;
}

// Defined here, opaque to plugins.
struct maxdev_host_context {
  const std::string* plugin;             // the plugin's name, for logs and errors
  const maxdev::dispatch::OpSignature* sig = nullptr;  // null outside kernel calls
  const maxdev::dispatch::CallArgs* args = nullptr;    // the call's arguments, with sig
  std::string error;                     // set_error's message, or a failed host call's
  bool host_failure = false;             // `error` is a host call's, not yet reported
  // PyTorch's own error on the call's input, from a host call (resize_output
  // of an out= that is also an input): a kernel failing with it raises it
  // as is, the CPU's error type and message.
  std::exception_ptr input_error;
  bool meta = false;                     // a meta function's call: outputs are meta tensors
  // One per return of the op: an allocated one (alloc_output) holds its
  // tensor; an aliased one (in-place, out=) is the argument tensor it
  // aliases, borrowed for the call (resize_output resizes it).
  struct Output {
    at::Tensor allocated;
    const at::Tensor* alias = nullptr;  // null: allocated
    maxdev_tensor view;                 // of the allocated or resized tensor, once it is
  };
  c10::SmallVector<Output, 2> outputs;
  c10::SmallVector<const maxdev_tensor*, 2> output_ptrs;  // call->outputs
};

namespace maxdev::dispatch {

const maxdev_host_api* host_api();

// An ABI dtype and its MAXDEV_DTYPE_* capability bit (0: the ABI has no
// code for the scalar type), by scalar type.
struct AbiDtype {
  maxdev_dtype abi;
  uint64_t mask;
};
extern const std::array<AbiDtype, static_cast<size_t>(c10::ScalarType::NumOptions)> kAbiDtypes;

// DLPack-layout view of `t`, borrowed: valid while `t` lives unchanged.
maxdev_tensor tensor_view(const at::Tensor& t, bool writable);

// The same, written into `view` (a strided tensor): returns the dtype's
// capability bit, 0 for a dtype the ABI has no code for. Inline: every
// plugin call converts its tensors with it.
C10_ALWAYS_INLINE uint64_t fill_tensor_view(const c10::TensorImpl& impl, bool writable, maxdev_tensor& view) {
  // The storage's first byte, not the tensor's: an empty tensor has no
  // data pointer in ATen, but its storage may still hold bytes (an out= of
  // the wrong size), which a kernel that writes without resizing must find
  // in bounds. A meta tensor's storage has none. Writing materializes a
  // copy-on-write storage, as mutable_data_ptr() does.
  const c10::Storage& storage = impl.unsafe_storage();
  // Every field read before any is written: the compiler cannot tell the
  // view's bytes from the tensor's.
  const caffe2::TypeMeta dtype = impl.dtype();
  const int64_t offset = impl.storage_offset();
  const bool on_cpu = impl.is_cpu();
  const c10::IntArrayRef sizes = impl.sizes();
  const int64_t* strides = impl.strides().data();
  const AbiDtype& entry = kAbiDtypes[static_cast<size_t>(dtype.toScalarType())];
  view.data = !storage ? nullptr : writable ? storage.mutable_data() : const_cast<void*>(storage.data());
  view.byte_offset = static_cast<uint64_t>(offset * static_cast<int64_t>(dtype.itemsize()));
  view.device = {on_cpu ? MAXDEV_DEVICE_CPU : MAXDEV_DEVICE_MAX, 0};
  view.ndim = static_cast<int32_t>(sizes.size());
  view.shape = const_cast<int64_t*>(sizes.data());
  view.strides = const_cast<int64_t*>(strides);
  view.dtype = entry.abi;
  return entry.mask;
}

// ABI dtype of a scalar type (false: the ABI has no code for it).
bool to_abi_dtype(c10::ScalarType type, maxdev_dtype* out);
std::optional<c10::ScalarType> from_abi_dtype(maxdev_dtype dtype);

}  // namespace maxdev::dispatch
