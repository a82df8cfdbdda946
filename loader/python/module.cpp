// max_device._C: the Python face of the loader. Thin bindings only; the
// Python package (python/max_device) shapes them into the public API.
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include "common/log.h"
#include "device/allocator.h"
#include "device/generator.h"
#include "dispatch/cpu_fallback.h"

namespace py = pybind11;

namespace maxdev::python {
namespace {

dispatch::FallbackPolicy policy_arg(const std::string& name) {
  try {
    return dispatch::parse_policy(name);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

void bind_device(py::module_& m) {
  m.def("_memory_stats", [] {
    const auto s = device::allocator().stats();
    py::dict d;
    d["allocated_bytes"] = s.allocated_bytes;
    d["peak_allocated_bytes"] = s.peak_allocated_bytes;
    d["allocations"] = s.allocations;
    d["frees"] = s.frees;
    return d;
  });
  m.def("_reset_peak_memory_stats", [] { device::allocator().reset_peak(); });
  m.def("_default_generator", [] {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(device::default_generator()));
  });
}

void bind_fallback(py::module_& m) {
  m.def("_set_fallback_policy", [](const std::string& p) { dispatch::set_fallback_policy(policy_arg(p)); });
  m.def("_fallback_policy", [] { return std::string(dispatch::policy_name(dispatch::fallback_policy())); });
  m.def("_set_op_fallback_policy", [](const std::string& op, std::optional<std::string> p) {
    dispatch::set_op_fallback_policy(op, p ? std::optional(policy_arg(*p)) : std::nullopt);
  });
  m.def("_op_fallback_policies", [] {
    py::dict d;
    for (const auto& [op, p] : dispatch::op_fallback_policies()) d[py::str(op)] = dispatch::policy_name(p);
    return d;
  });
  m.def("_fallback_counts", [] {
    py::dict d;
    for (const auto& [op, n] : dispatch::fallback_counts()) d[py::str(op)] = n;
    return d;
  });
  m.def("_reset_fallback_counts", &dispatch::reset_fallback_counts);
  m.def("_set_fallback_impl", [](const std::string& impl) {
    if (impl == "zero_copy") return dispatch::set_fallback_impl(dispatch::FallbackImpl::zero_copy);
    if (impl == "copying") return dispatch::set_fallback_impl(dispatch::FallbackImpl::copying);
    throw py::value_error("fallback implementation must be 'zero_copy' or 'copying', got '" + impl + "'");
  });
}

void bind_log(py::module_& m) {
  m.def("_set_log_level", [](const std::string& level) {
    try {
      log::set_level(level);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("_log_level", &log::level);
  m.def("_log", [](const std::string& level, const std::string& message) {
    static const std::pair<const char*, log::Level> kLevels[] = {
        {"trace", log::Level::trace}, {"debug", log::Level::debug}, {"info", log::Level::info},
        {"warn", log::Level::warn},   {"error", log::Level::error}};
    for (const auto& [name, value] : kLevels) {
      if (level == name) return log::write(value, message);
    }
    throw py::value_error("unknown log level '" + level + "'");
  });
}

}  // namespace
}  // namespace maxdev::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "max_device loader bindings (internal; use the max_device package)";
  maxdev::python::bind_device(m);
  maxdev::python::bind_fallback(m);
  maxdev::python::bind_log(m);
}
