// How an op's boxed arguments cross the plugin ABI, decided once per op
// from its schema (not per call).
#pragma once

#include <ATen/core/function_schema.h>

#include <optional>
#include <string>
#include <vector>

namespace maxdev::dispatch {

enum class ArgKind : uint8_t {
  tensor, int_, float_, bool_, scalar, int_list, float_list, bool_list, tensor_list, string, dtype
};

struct ArgPlan {
  ArgKind kind;
  bool optional;  // None passes as MAXDEV_VALUE_NONE
  bool written;   // Tensor(a!): the kernel writes into it
};

struct OpSignature {
  std::string name;                  // "aten::add.out"
  std::vector<ArgPlan> args;
  std::vector<int> return_aliases;   // per return: the argument it aliases, or -1
};

// The plan for `schema`, or an explanation of why the ABI cannot pass it.
struct SignatureResult {
  std::optional<OpSignature> signature;
  std::string why_not;
};
SignatureResult plan_signature(const c10::FunctionSchema& schema);

// The ABI minor version a plugin must be built against to be passed this
// op's arguments (1.3 added bool[]); an older plugin is refused the op.
uint32_t abi_minor_needed(const OpSignature& sig);

}  // namespace maxdev::dispatch
