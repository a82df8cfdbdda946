// Which ops a plugin kernel should serve. An op whose CPU behaviour comes
// from a CompositeImplicitAutograd kernel (aten::softmax.int) gets its
// gradients by decomposing into other ops: a PrivateUse1 kernel on it
// replaces the decomposition for the forward, and autograd then has no
// formula for it (gradients silently become None). Such kernels are refused
// unless a plugin opts in to forward-only use.
#pragma once

#include <string>

namespace maxdev::dispatch {

// Throws std::invalid_argument naming the overload to serve instead when
// `op` is CompositeImplicitAutograd and `allow_composite` is false; with it,
// warns once per op and process.
void check_dispatch_kind(const std::string& op, bool allow_composite);

// The overload whose kernel keeps autograd for a composite op (e.g.
// "aten::_softmax.out" for "aten::softmax.int"), or "" when none is obvious.
std::string overload_to_serve(const std::string& op);

}  // namespace maxdev::dispatch
