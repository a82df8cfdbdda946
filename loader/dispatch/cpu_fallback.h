// The bottom of every op on max_device: PyTorch's CPU kernel, run on the
// device tensors' own bytes (see device/host_alias.h), with a policy that
// makes every fallback visible and, if the user wants, an error.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace maxdev::dispatch {

// Run the CPU kernel of `op` on the arguments on `stack`, zero copy:
// PyTorch's CPU kernel of `op`, or `cpu_kernel` (for ops whose CPU
// implementation lives under another name) on the CPU aliases.
using CpuKernel = void (*)(torch::jit::Stack* stack);

void run_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                    CpuKernel cpu_kernel = nullptr);

enum class FallbackPolicy : int8_t { allow = 0, warn = 1, error = 2 };

FallbackPolicy parse_policy(const std::string& name);  // throws std::invalid_argument
const char* policy_name(FallbackPolicy policy);

// Global policy (initially from MAX_DEVICE_FALLBACK, default allow).
void set_fallback_policy(FallbackPolicy policy);
FallbackPolicy fallback_policy();
// Per-op policy ("aten::mm", "aten::add.out"); nullopt removes the override.
void set_op_fallback_policy(const std::string& op, std::optional<FallbackPolicy> policy);
std::vector<std::pair<std::string, FallbackPolicy>> op_fallback_policies();

// How often each op fell back since start (or the last reset).
std::vector<std::pair<std::string, int64_t>> fallback_counts();
void reset_fallback_counts();

// The fallback an op takes: zero copy (the design), or PyTorch's copying
// at::native::cpu_fallback (kept only as the benchmark's baseline).
enum class FallbackImpl { zero_copy, copying };
void set_fallback_impl(FallbackImpl impl);

// The fallback of one call: applies the policy for `op` (throws under
// `error`), counts the call, and runs the CPU kernel (run_cpu_kernel) inside
// a profiler range "max_device: <op> <- cpu fallback".
void fall_back(const c10::OperatorHandle& op, torch::jit::Stack* stack, CpuKernel cpu_kernel = nullptr);

// Direct fallbacks. The functional and in-place forms of PyTorch's
// structured ops (add.Tensor, add_.Tensor) reach a device with no kernel of
// its own through a composite: it computes the output's shape, allocates it
// on the device and calls the out= form (add.out), which falls back. While
// no max_device provider serves the form or its out= op, max_device sends
// the form itself to the CPU fallback: one dispatch, no device allocation,
// the shape computed once, the CPU's own kernel for that form.
//
// Unboxed fallbacks. The dispatcher boxes every call to the fallback into
// a heap-allocated stack, and the fallback calls the CPU kernel boxed. An op
// whose C++ signature is a common one (dispatch/unboxed_signatures.h: mm.out,
// add.out, relu, ...) gets a fallback kernel of its own instead, called and
// calling unboxed; the forms too, where their signature allows.
//
// The ops with a fallback kernel of their own (forms and unboxed).
std::vector<std::string> direct_fallback_ops();
bool is_direct_fallback(const std::string& op);
// Before a provider serves `op`: ends the fallback kernel of `op` and the
// direct fallbacks of every form computed by `op`, for good, so calls
// reach the provider (through PyTorch's composite, for the forms).
void end_direct_fallbacks(const std::string& op);
// Around loading a library that may register kernels on the device key
// (torch.ops.load_library of a TORCH_LIBRARY_IMPL): suspend lifts every
// fallback kernel (calls meanwhile take the boxed fallback), so none is
// overridden; resume puts back those of the ops the library left alone,
// and ends the forms of the out= ops it serves.
void suspend_direct_fallbacks();
void resume_direct_fallbacks();

}  // namespace maxdev::dispatch
