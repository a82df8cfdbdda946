// A PrivateUse1 kernel the loader makes once and registers any number of
// times.
//
// The dispatcher reads an op's kernel table without synchronization: a
// thread may have read a kernel and be running it while another thread
// takes that kernel off the table (a plugin's first kernel for an op ends
// the op's CPU fallback kernel; load_library suspends every fallback
// kernel). When the table held the only reference to a kernel's object, the
// call went on inside freed memory. Every registration of a SharedKernel
// shares its one object, which lives as long as the SharedKernel does, and
// the loader keeps each SharedKernel for the life of its op: taking a
// kernel off the table never frees it under a call.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <optional>

namespace maxdev::dispatch {

class SharedKernel {
 public:
  // `cpp_signature` and `inferred_schema` as registerImpl takes them: set
  // for an unboxed kernel, which the dispatcher checks against the op's.
  SharedKernel(c10::KernelFunction function, std::optional<c10::impl::CppSignature> cpp_signature,
               std::optional<c10::FunctionSchema> inferred_schema, const char* debug)
      : function_(std::move(function)),
        cpp_signature_(cpp_signature),
        inferred_schema_(std::move(inferred_schema)),
        debug_(debug) {}

  // Registers the kernel for `op` on PrivateUse1; the registration lasts
  // as long as the handle. Throws c10::Error where registerImpl does (a
  // kernel of another C++ signature is registered for the op).
  c10::RegistrationHandleRAII register_for(const c10::OperatorHandle& op) const {
    return c10::Dispatcher::singleton().registerImpl(
        op.operator_name(), c10::DispatchKey::PrivateUse1, function_, cpp_signature_,
        inferred_schema_ ? std::make_unique<c10::FunctionSchema>(*inferred_schema_) : nullptr, debug_);
  }

 private:
  c10::KernelFunction function_;  // copies share its functor
  std::optional<c10::impl::CppSignature> cpp_signature_;
  std::optional<c10::FunctionSchema> inferred_schema_;
  const char* debug_;
};

// A kernel and one registration of it.
struct RegisteredKernel {
  SharedKernel kernel;
  c10::RegistrationHandleRAII registration;
};

// Registers `kernel` for `op` (throws as SharedKernel::register_for).
inline RegisteredKernel register_kernel(SharedKernel kernel, const c10::OperatorHandle& op) {
  auto registration = kernel.register_for(op);
  return {std::move(kernel), std::move(registration)};
}

}  // namespace maxdev::dispatch
