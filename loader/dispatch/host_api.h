// The host side of the plugin ABI: the function table handed to plugins
// and the per-call context behind `maxdev_host_context`.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <max_device/plugin.h>

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
  // One slot per return of the op. An allocated one (alloc_output) is
  // held in `outputs`; an aliased one is the argument tensor it aliases,
  // borrowed for the call (resize_output resizes it).
  c10::SmallVector<at::Tensor, 2> outputs;
  c10::SmallVector<const at::Tensor*, 2> aliases;  // null: allocated
  c10::SmallVector<maxdev_tensor, 2> output_views;
  c10::SmallVector<const maxdev_tensor*, 2> output_ptrs;
};

namespace maxdev::dispatch {

const maxdev_host_api* host_api();

// DLPack-layout view of `t`, borrowed: valid while `t` lives unchanged.
maxdev_tensor tensor_view(const at::Tensor& t, bool writable);

// ABI dtype of a scalar type, and its capability-mask bit (0: none).
bool to_abi_dtype(c10::ScalarType type, maxdev_dtype* out);
uint64_t dtype_mask_bit(c10::ScalarType type);
std::optional<c10::ScalarType> from_abi_dtype(maxdev_dtype dtype);

}  // namespace maxdev::dispatch
