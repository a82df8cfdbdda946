// The PrivateUse1 kernel the loader registers for an op a plugin serves:
// it runs the op's providers (top of the stack first) and, when all of
// them decline, PyTorch's CPU kernel on the same memory.
//
// Two shapes of one logic. Ops with a common C++ signature (unary, binary
// with or without alpha, their in-place and out= variants, reductions over
// dims, softmax) get an unboxed trampoline: the dispatcher calls it with
// C++ arguments, as it calls a native kernel, and it boxes them into an
// inline buffer only for the providers, instead of the heap-allocated stack
// of a boxed call (a `str` argument still allocates its IValue). Every
// other op gets the boxed trampoline. Both reach the same providers,
// counters, errors and fallback. Measured, this did not lower the call's
// cost (README, Benchmarks): the conversions to the ABI dominate.
#pragma once

#include "dispatch/shared_kernel.h"

namespace maxdev::dispatch {

struct OpSlot;

// Registers the trampoline of `slot` on PrivateUse1; `*unboxed` tells
// whether it is the unboxed one. The slot keeps the kernel for its life.
RegisteredKernel register_trampoline(OpSlot* slot, bool* unboxed);

}  // namespace maxdev::dispatch
