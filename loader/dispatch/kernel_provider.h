// A plugin kernel as a provider: checks the kernel's declared capabilities
// against the call's arguments, calls it with their ABI values, and turns
// its outputs and status into returns, a decline, or a KernelError.
#pragma once

#include <max_device/plugin.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "dispatch/op_table.h"

namespace maxdev::dispatch {

// What a kernel of a plugin needs from its plugin while it serves calls.
struct KernelOwner {
  std::string plugin;          // name
  std::string owner;           // "name@version"
  int64_t generation = 0;      // of the plugin: 1 at load, +1 per published reload
  std::string file;            // the user's path, for errors
  void* state = nullptr;       // from the plugin's init
  std::shared_ptr<const void> keep_alive;  // holds the library mapped
  mutable std::atomic<int64_t> in_flight{0};  // kernel calls running now
};

class KernelProvider final : public Provider {
 public:
  KernelProvider(std::shared_ptr<const KernelOwner> owner, const maxdev_kernel_def& kernel);
  bool run(const CallArgs& args, Returns& returns) override;
  bool run_meta(const OpSlot& slot, torch::jit::Stack* stack) override;
  const std::string& backward_op() const override { return backward_; }

 private:
  bool accepts(const CallArgs& args) const;

  std::shared_ptr<const KernelOwner> owner_;
  maxdev_kernel_fn fn_;
  maxdev_kernel_fn meta_;  // may be null
  std::string backward_;   // "" for none
  // The kernel's capabilities, decoded once.
  uint64_t dtypes_;  // MAXDEV_DTYPE_* mask; all bits for a kernel that takes any
  bool cpu_tensors_, contiguous_only_, same_dtype_;
};

// Kernel checks: a debugging mode in which every plugin call also proves
// that the kernel kept the contract the host cannot see cheaply. Its
// read-only tensor arguments are hashed before and after the call, and its
// allocated outputs are compared (shape, dtype) with what PyTorch's meta
// kernel of the op computes for the same arguments (ops without a meta
// kernel are not compared). A breach is a KernelError. Off by default; on
// at startup when MAX_DEVICE_CHECK_KERNELS=1.
void set_kernel_checks(bool enabled);
bool kernel_checks();

// Raises the error of a failed kernel call (throw_call_error, "kernel").
[[noreturn]] void throw_kernel_error(const KernelOwner& owner, const std::string& op,
                                     const std::string& message);

// The returns PyTorch's meta kernel of the op gives for these arguments
// (shapes and dtypes, no data); nullopt when the op has no meta kernel.
std::optional<torch::jit::Stack> meta_returns(const OpSlot& slot, c10::ArrayRef<c10::IValue> args);

// "Float[4, 5]", for contract messages.
std::string describe(const at::Tensor& t);

}  // namespace maxdev::dispatch
