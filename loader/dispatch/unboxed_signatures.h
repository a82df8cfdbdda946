// The C++ signatures max_device registers unboxed kernels for: the
// dispatcher calls such a kernel with the op's C++ arguments, as it calls a
// native kernel, without boxing them into a heap-allocated stack. Two
// kernels use this list: the trampoline of an op a plugin serves
// (trampoline.cpp) and the zero-copy CPU fallback (cpu_fallback.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <c10/core/Scalar.h>

#include <array>
#include <optional>
#include <string>
#include <type_traits>

#include "common/log.h"
#include "dispatch/shared_kernel.h"

namespace maxdev::dispatch {

template <class Fn>
struct Signature;

// What an unboxed kernel of C++ signature Ret(Args...) can tell from its
// types: a `Tensor&` argument is written (in-place self, out=), and a
// `Tensor&` return is that argument. A `void` op writes its tensor-list
// arguments (the fused optimizers: PointerSignatures below).
template <class Ret, class... Args>
struct Signature<Ret(Args...)> {
  static constexpr std::array<bool, sizeof...(Args)> kWritten = {std::is_same_v<Args, at::Tensor&>...};
  static constexpr int kWrittenIndex = [] {
    for (size_t i = 0; i < kWritten.size(); ++i) {
      if (kWritten[i]) return static_cast<int>(i);
    }
    return -1;
  }();
  static_assert(std::is_same_v<Ret, at::Tensor> || (std::is_same_v<Ret, at::Tensor&> && kWrittenIndex >= 0) ||
                std::is_void_v<Ret>);

  // Whether the dispatcher would call a kernel of this signature for
  // `schema`: the same types, a `Tensor&` for every written tensor, the
  // returns. (Whether a return aliases an argument is the caller's check.)
  static bool matches(const c10::FunctionSchema& schema) {
    if (schema.arguments().size() != sizeof...(Args) || schema.returns().size() != (std::is_void_v<Ret> ? 0 : 1)) {
      return false;
    }
    if (c10::findSchemaDifferences(c10::inferFunctionSchemaFlattenedReturns<Ret(Args...)>(), schema)) {
      return false;
    }
    for (size_t i = 0; i < sizeof...(Args); ++i) {
      const c10::Argument& a = schema.arguments()[i];
      // SymInts reach a kernel through a conversion the C++ signature hides.
      if (a.real_type()->str().find("SymInt") != std::string::npos) return false;
      // A written tensor list is a `TensorList` like a read one.
      const bool written = a.alias_info() != nullptr && a.alias_info()->isWrite() && !a.type()->castRaw<c10::ListType>();
      if (written != kWritten[i]) return false;
    }
    return true;
  }

  // `kernel` (a functor of this signature) as a kernel the dispatcher
  // calls unboxed.
  template <class Functor>
  static SharedKernel shared_kernel(std::unique_ptr<Functor> kernel, const char* debug) {
    return SharedKernel(c10::KernelFunction::makeFromUnboxedFunctor<false, Functor>(std::move(kernel)),
                        c10::impl::CppSignature::make<Ret(Args...)>(),
                        c10::inferFunctionSchemaFlattenedReturns<Ret(Args...)>(), debug);
  }
};

template <class... Fns>
struct SignatureList {};

using at::Scalar;
using at::Tensor;
using OptDims = at::OptionalIntArrayRef;
using OptDtype = std::optional<at::ScalarType>;

// Elementwise, reductions, softmax and GEMM in their functional, in-place
// and out= forms: the ops a model calls most.
using UnboxedSignatures = SignatureList<
    Tensor(const Tensor&), Tensor&(Tensor&), Tensor&(const Tensor&, Tensor&),                      // unary
    Tensor(const Tensor&, const Tensor&), Tensor&(Tensor&, const Tensor&),                           // binary
    Tensor&(const Tensor&, const Tensor&, Tensor&),                                                  //
    Tensor(const Tensor&, const Tensor&, const Scalar&), Tensor&(Tensor&, const Tensor&, const Scalar&),  // alpha
    Tensor&(const Tensor&, const Tensor&, const Scalar&, Tensor&),                                   //
    Tensor(const Tensor&, const Scalar&), Tensor&(Tensor&, const Scalar&),                           // scalar
    Tensor&(const Tensor&, const Scalar&, Tensor&),                                                  //
    Tensor(const Tensor&, OptDims, bool, OptDtype), Tensor&(const Tensor&, OptDims, bool, OptDtype, Tensor&),  // sum, mean
    Tensor(const Tensor&, int64_t, bool), Tensor&(const Tensor&, int64_t, bool, Tensor&),            // _softmax
    Tensor(const Tensor&, const Tensor&, int64_t, at::ScalarType),                                   // its backward
    Tensor&(const Tensor&, const Tensor&, int64_t, at::ScalarType, Tensor&),                         //
    Tensor(const Tensor&, c10::string_view), Tensor&(Tensor&, c10::string_view),                     // gelu
    Tensor&(const Tensor&, c10::string_view, Tensor&),                                               //
    Tensor(const Tensor&, const Tensor&, const Tensor&, const Scalar&, const Scalar&),               // addmm
    Tensor&(const Tensor&, const Tensor&, const Tensor&, const Scalar&, const Scalar&, Tensor&)>;

using at::TensorList;
using OptTensor = const std::optional<Tensor>&;

// The fused optimizers (_fused_adam_, _fused_adamw_, _fused_sgd_,
// _fused_adagrad_, with a float or a Tensor lr): one call per step over
// every parameter, whose CPU kernels reach the tensors of their lists only
// through data pointers. The fallback passes those lists as they are (no
// CPU alias per tensor; cpu_fallback.cpp's kPointerOps).
using PointerSignatures = SignatureList<
    void(TensorList, TensorList, TensorList, TensorList, TensorList, TensorList, double, double, double, double,
         double, bool, bool, OptTensor, OptTensor),  // adam, adamw
    void(TensorList, TensorList, TensorList, TensorList, TensorList, TensorList, const Tensor&, double, double,
         double, double, bool, bool, OptTensor, OptTensor),  // their tensor_lr
    void(TensorList, TensorList, TensorList, double, double, double, double, bool, bool, bool, OptTensor,
         OptTensor),  // sgd
    void(TensorList, TensorList, TensorList, double, double, const Tensor&, double, bool, bool, bool, OptTensor,
         OptTensor),  // its tensor_lr
    void(TensorList, TensorList, TensorList, TensorList, double, double, double, double, bool, OptTensor,
         OptTensor),  // adagrad
    void(TensorList, TensorList, TensorList, TensorList, const Tensor&, double, double, double, bool, OptTensor,
         OptTensor)>;  // its tensor_lr

// Registers on PrivateUse1 the `Kernel<Fn>` of the first signature Fn in
// the list that `Kernel<Fn>::matches(target)` (`Kernel<Fn>::make(target)`
// makes it); nullopt when none matches or the dispatcher refuses it (a
// kernel of another C++ signature is already registered for the op: a
// native kernel's, generated from the same schema).
template <template <class> class Kernel, class Target, class... Fns>
std::optional<RegisteredKernel> register_unboxed(const c10::OperatorHandle& op, const Target& target,
                                                 const std::string& name, SignatureList<Fns...>) {
  std::optional<RegisteredKernel> registered;
  auto attempt = [&](auto matches, auto make) {
    if (registered || !matches(target)) return;
    try {
      registered.emplace(register_kernel(make(target), op));
    } catch (const c10::Error& e) {
      log::debug("no unboxed kernel for " + name + ": " + e.what_without_backtrace());
    }
  };
  (attempt(&Kernel<Fns>::matches, &Kernel<Fns>::make), ...);
  return registered;
}

}  // namespace maxdev::dispatch
