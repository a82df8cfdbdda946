#include "dispatch/dispatch_kind.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <mutex>
#include <set>
#include <stdexcept>

#include "common/log.h"

namespace maxdev::dispatch {
namespace {

std::optional<c10::OperatorHandle> find_op(const std::string& op) {
  const auto sep = op.find("::");
  if (sep == std::string::npos) return std::nullopt;
  const auto dot = op.find('.', sep + 2);
  const c10::OperatorName name = dot == std::string::npos ? c10::OperatorName(op, "")
                                                         : c10::OperatorName(op.substr(0, dot), op.substr(dot + 1));
  return c10::Dispatcher::singleton().findSchema(name);
}

bool is_composite_implicit(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

}  // namespace

std::string overload_to_serve(const std::string& op) {
  const auto sep = op.find("::");
  const auto dot = op.find('.', sep + 2);
  const std::string ns = op.substr(0, sep);
  std::string base = op.substr(sep + 2, dot == std::string::npos ? std::string::npos : dot - sep - 2);
  while (!base.empty() && base.front() == '_') base.erase(0, 1);
  // The implementation op PyTorch's composite usually calls (_softmax for
  // softmax), its out= variant first: a structured .out kernel also serves
  // the functional and in-place forms.
  for (const std::string& candidate : {ns + "::_" + base + ".out", ns + "::" + base + ".out", ns + "::_" + base,
                                       ns + "::" + base}) {
    if (candidate == op) continue;
    const auto handle = find_op(candidate);
    if (handle && !is_composite_implicit(*handle)) return candidate;
  }
  return "";
}

void check_dispatch_kind(const std::string& op, bool allow_composite) {
  const auto handle = find_op(op);
  if (!handle || !is_composite_implicit(*handle)) return;
  if (allow_composite) {
    static std::mutex mutex;
    static std::set<std::string> warned;
    std::lock_guard lock(mutex);
    if (warned.insert(op).second) {
      log::warn(op + " is CompositeImplicitAutograd: a plugin kernel on it (allowed by allow_composite) serves the "
                "forward only; gradients through it are None");
    }
    return;
  }
  const std::string instead = overload_to_serve(op);
  throw std::invalid_argument(
      "is CompositeImplicitAutograd: PyTorch computes it (and its gradients) by decomposing it into other ops, so a "
      "kernel here would run the forward and silently drop gradients; serve " +
      (instead.empty() ? std::string("the ops it decomposes into") : instead) +
      " instead (python -m max_device schema " + op.substr(op.find("::") + 2, op.find('.') - op.find("::") - 2) +
      " lists the overloads), or load with allow_composite=True for forward-only use");
}

}  // namespace maxdev::dispatch
