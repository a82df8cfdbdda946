// Python functions as providers: max_device.override(op, fn).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>

#include "dispatch/op_table.h"

namespace maxdev::python {

// Calls `fn` with the op's arguments (keyword-only ones as keywords).
// Returning NotImplemented declines. While `fn` runs, a call of the same op
// on the same thread skips it, so `fn` can call the op to reach the layer
// below.
std::shared_ptr<dispatch::Provider> make_python_override(pybind11::object fn, const std::string& op,
                                                         const std::string& label);

}  // namespace maxdev::python
