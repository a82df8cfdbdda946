// max_device._C: the Python face of the loader. Thin bindings only; the
// Python package (python/max_device) shapes them into the public API.
#include <ATen/EmptyTensor.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "common/log.h"
#include "device/allocator.h"
#include "device/generator.h"
#include "device/host_alias.h"
#include "device/streams.h"
#include "dispatch/cpu_fallback.h"
#include "dispatch/dispatch_kind.h"
#include "dispatch/kernel_provider.h"
#include "dispatch/op_table.h"
#include "plugins/errors.h"
#include "plugins/registry.h"
#include "plugins/snapshot.h"
#include "plugins/watcher.h"
#include "python/overrides.h"

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

// Parses a tuple of Python ints (Inductor's sizes and strides).
void int_tuple(PyObject* tuple, c10::SmallVector<int64_t, 8>& out, const char* what) {
  TORCH_CHECK_TYPE(PyTuple_Check(tuple), "_empty_strided: ", what, " must be a tuple of ints");
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long value = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (value == -1 && PyErr_Occurred()) throw python_error();
    out.push_back(value);
  }
}

// _empty_strided(sizes, strides, dtype): a tensor on the current max_device
// device, as torch._C._dynamo.guards._empty_strided_cpu for the CPU. Inductor's
// generated wrapper allocates its buffers with it: torch.empty_strided's
// argument parser and dispatch cost about 2 us per buffer.
PyObject* empty_strided(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *sizes_arg = nullptr, *strides_arg = nullptr, *dtype_arg = nullptr;
  if (!PyArg_ParseTuple(args, "OOO", &sizes_arg, &strides_arg, &dtype_arg)) return nullptr;
  TORCH_CHECK_TYPE(THPDtype_Check(dtype_arg), "_empty_strided: dtype must be a torch.dtype");
  c10::SmallVector<int64_t, 8> sizes, strides;
  int_tuple(sizes_arg, sizes, "sizes");
  int_tuple(strides_arg, strides, "strides");
  return THPVariable_Wrap(at::detail::empty_strided_generic(sizes, strides, &device::allocator(),
                                                            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                            reinterpret_cast<THPDtype*>(dtype_arg)->scalar_type));
  END_HANDLE_TH_ERRORS
}

PyMethodDef empty_strided_def = {"_empty_strided", empty_strided, METH_VARARGS, nullptr};

void bind_device(py::module_& m) {
  m.add_object("_empty_strided", py::reinterpret_steal<py::object>(PyCFunction_New(&empty_strided_def, nullptr)));
  m.def("_device_count", [] { return static_cast<int>(device::device_count()); });
  m.attr("_MAX_DEVICE_COUNT") = static_cast<int>(device::kMaxDevices);
  m.def("_memory_stats", [](int index) {
    const auto s = device::allocator().stats(static_cast<c10::DeviceIndex>(index));
    py::dict d;
    d["allocated_bytes"] = s.allocated_bytes;
    d["peak_allocated_bytes"] = s.peak_allocated_bytes;
    d["allocations"] = s.allocations;
    d["frees"] = s.frees;
    return d;
  });
  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(device::default_generator(static_cast<c10::DeviceIndex>(index))));
  });
}

void bind_streams(py::module_& m) {
  m.def("_stream_priority", [](int64_t stream_id) { return device::stream_priority(stream_id); });
  m.attr("_STREAM_PRIORITY_RANGE") =
      py::make_tuple(device::kLowestStreamPriority, device::kHighestStreamPriority);
}

// Sharing max_device storages between processes (python/max_device/_sharing.py):
// a shared device storage lives on a CPU buffer in shared memory.
void bind_sharing(py::module_& m) {
  auto storage_arg = [](const py::object& obj) -> const c10::Storage& {
    if (!THPStorage_Check(obj.ptr())) throw py::type_error("expected a torch.UntypedStorage");
    return THPStorage_Unpack(obj.ptr());
  };
  m.def("_adopted_host_storage", [storage_arg](const py::object& device_storage) -> py::object {
    auto cpu = device::adopted_cpu_storage(storage_arg(device_storage));
    if (!cpu) return py::none();
    return py::reinterpret_steal<py::object>(THPStorage_Wrap(std::move(*cpu)));
  });
  m.def("_rehost", [storage_arg](const py::object& device_storage, const py::object& cpu_storage) {
    device::rehost(storage_arg(device_storage), storage_arg(cpu_storage));
  });
  m.def("_adopt_host_tensor", [](const at::Tensor& cpu, int index) {
    TORCH_CHECK(cpu.is_cpu(), "max_device: expected a CPU tensor, got one on ", cpu.device());
    device::CurrentDeviceScope on(static_cast<c10::DeviceIndex>(index));
    return device::device_tensor_on(device::adopt_cpu_storage(cpu.storage()), cpu);
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
    try {
      log::write(log::parse_level(level), message);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
}

// Paths and messages that may hold a path: bytes are not always UTF-8 on
// Linux, so they decode as os.fsdecode does (undecodable bytes become
// surrogate escapes, which os.fsencode turns back into the same bytes).
py::str fs_str(const std::string& bytes) {
  PyObject* text = PyUnicode_DecodeFSDefaultAndSize(bytes.data(), static_cast<Py_ssize_t>(bytes.size()));
  if (text == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(text);
}

py::dict plugin_info(const plugins::PluginInfo& info) {
  py::dict d;
  d["id"] = info.id;
  d["name"] = info.name;
  d["version"] = info.version;
  d["path"] = fs_str(info.path);
  d["origin"] = fs_str(info.origin);
  d["allow_untrusted"] = info.allow_untrusted;
  d["allow_composite"] = info.allow_composite;
  d["snapshot"] = fs_str(info.snapshot);
  d["sha256"] = info.sha256;
  d["abi"] = std::to_string(info.abi_major) + "." + std::to_string(info.abi_minor);
  d["ops"] = info.ops;
  d["defines"] = info.defines;
  d["generation"] = info.generation;
  d["loaded_at_ns"] = info.loaded_at_ns;
  d["load_duration_ns"] = info.load_duration_ns;
  d["previous_versions"] = info.previous_versions;
  d["calls_in_flight"] = info.calls_in_flight;
  return d;
}

py::dict manifest_dict(const plugins::Manifest& m) {
  py::dict d;
  d["name"] = m.name;
  d["version"] = m.version;
  d["abi"] = std::to_string(m.abi_major) + "." + std::to_string(m.abi_minor);
  py::list kernels;
  for (const auto& k : m.kernels) {
    py::dict kd;
    kd["op"] = k.op;
    kd["schema"] = k.schema;
    kd["dtypes"] = k.dtypes;
    kd["flags"] = k.flags;
    kernels.append(kd);
  }
  d["kernels"] = kernels;
  d["exported_symbols"] = m.exported_symbols;
  return d;
}

// Raises max_device.KernelError (a kernel failed) or PluginStateError (an
// op whose plugin was unloaded) through PyTorch's op bindings, which
// restore a pending Python error carried by torch's python_error.
void raise_call_error(const char* kind, const std::string& plugin, const std::string& op, const std::string& file,
                      const std::string& message) {
  py::gil_scoped_acquire gil;
  const char* type = std::string(kind) == "kernel" ? "KernelError" : "PluginStateError";
  py::object cls = py::module_::import("max_device.errors").attr(type);
  py::object error = cls(fs_str("plugin '" + plugin + "', op " + op + " (" + file + "): " + message));
  error.attr("file") = fs_str(file);
  error.attr("plugin") = plugin;
  error.attr("op") = op;
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw python_error();
}

// Runs registry work without the GIL: a change may wait for calls in
// flight, and listings wait for changes; either may need a Python override
// (which takes the GIL) to finish first.
template <typename Work>
auto without_gil(Work&& work) {
  py::gil_scoped_release nogil;
  return work();
}

template <typename Change>
py::dict change_plugin(Change&& change) {
  return plugin_info(without_gil(std::forward<Change>(change)));
}

// Python callables as the registry's checks; each runs with the GIL.
plugins::Checks checks_from(py::object before_open, py::object before_publish) {
  plugins::Checks checks;
  auto wrap = [](py::object fn) {
    return std::make_shared<py::object>(std::move(fn));
  };
  if (!before_open.is_none()) {
    auto fn = wrap(std::move(before_open));
    checks.before_open = [fn](const std::string& snapshot) {
      py::gil_scoped_acquire gil;
      (*fn)(snapshot);
    };
  }
  if (!before_publish.is_none()) {
    auto fn = wrap(std::move(before_publish));
    checks.before_publish = [fn](const std::vector<std::string>& ops) {
      py::gil_scoped_acquire gil;
      (*fn)(ops);
    };
  }
  return checks;
}

void bind_plugins(py::module_& m) {
  dispatch::set_call_error_hook(&raise_call_error);
  m.def("_load_plugin", [](const std::string& path, std::optional<std::string> name, py::object before_open,
                           py::object before_publish, const std::string& origin, std::optional<std::string> sha256,
                           bool allow_untrusted, bool allow_composite) {
    const auto checks = checks_from(std::move(before_open), std::move(before_publish));
    const plugins::LoadOptions options{origin, std::move(sha256), allow_untrusted, allow_composite};
    return change_plugin([&] { return plugins::PluginRegistry::instance().load(path, name, checks, options); });
  }, py::arg("path"), py::arg("name") = py::none(), py::arg("before_open") = py::none(),
     py::arg("before_publish") = py::none(), py::arg("origin") = "path", py::arg("sha256") = py::none(),
     py::arg("allow_untrusted") = false, py::arg("allow_composite") = false);
  m.def("_reload_plugin", [](const std::string& name, std::optional<std::string> path, bool force,
                             py::object before_open, py::object before_publish, std::optional<std::string> origin,
                             std::optional<std::string> sha256, std::optional<bool> allow_untrusted,
                             std::optional<bool> allow_composite, std::optional<uint64_t> id) {
    const auto checks = checks_from(std::move(before_open), std::move(before_publish));
    const plugins::ReloadOptions options{id, std::move(path), force, std::move(origin), std::move(sha256),
                                         allow_untrusted, allow_composite};
    return change_plugin([&] { return plugins::PluginRegistry::instance().reload(name, options, checks); });
  }, py::arg("name"), py::arg("path") = py::none(), py::arg("force") = false,
     py::arg("before_open") = py::none(), py::arg("before_publish") = py::none(), py::arg("origin") = py::none(),
     py::arg("sha256") = py::none(), py::arg("allow_untrusted") = py::none(),
     py::arg("allow_composite") = py::none(), py::arg("id") = py::none());
  m.def("_rollback_plugin", [](const std::string& name, std::optional<uint64_t> id) {
    return change_plugin([&] { return plugins::PluginRegistry::instance().rollback(name, id); });
  }, py::arg("name"), py::arg("id") = py::none());
  m.def("_plugin_info", [](uint64_t id) -> py::object {
    const auto info = without_gil([&] { return plugins::PluginRegistry::instance().plugin(id); });
    if (!info) return py::none();
    return plugin_info(*info);
  });
  m.def("_push_override", [](const std::string& op, py::object fn, const std::string& label) {
    auto provider = make_python_override(std::move(fn), op, label);
    py::gil_scoped_release nogil;
    return plugins::PluginRegistry::instance().push_override(op, std::move(provider));
  });
  m.def("_remove_override", [](uint64_t token) {
    py::gil_scoped_release nogil;
    return plugins::PluginRegistry::instance().remove_override(token);
  });
  m.def("_restore", [](const std::string& op) {
    py::gil_scoped_release nogil;
    return plugins::PluginRegistry::instance().restore(op);
  });
  m.def("_remove_all_overrides", [] {
    py::gil_scoped_release nogil;
    return plugins::PluginRegistry::instance().remove_all_overrides();
  });
  m.def("_unload_plugin", [](const std::string& name, std::optional<uint64_t> id) {
    const auto report = without_gil([&] { return plugins::PluginRegistry::instance().unload(name, id); });
    py::dict d;
    d["name"] = report.name;
    d["unmapped"] = report.unmapped;
    return d;
  }, py::arg("name"), py::arg("id") = py::none());
  m.def("_list_plugins", [] {
    py::list out;
    for (const auto& info : without_gil([] { return plugins::PluginRegistry::instance().plugins(); })) {
      out.append(plugin_info(info));
    }
    return out;
  });
  // Ops whose PrivateUse1 kernel is a loader trampoline (registered once,
  // kept after its last provider leaves), as opposed to max_device's own.
  m.def("_trampoline_ops", [] {
    std::vector<std::string> names;
    for (const auto* slot : dispatch::OpTable::instance().slots()) names.push_back(slot->name);
    return names;
  });
  // Ops with a fallback kernel of their own (dispatch/cpu_fallback.h).
  m.def("_direct_fallback_ops", &dispatch::direct_fallback_ops);
  m.def("_end_direct_fallbacks", &dispatch::end_direct_fallbacks);
  m.def("_suspend_direct_fallbacks", &dispatch::suspend_direct_fallbacks);
  m.def("_resume_direct_fallbacks", &dispatch::resume_direct_fallbacks);
  m.def("_set_kernel_checks", &dispatch::set_kernel_checks);
  m.def("_kernel_checks", &dispatch::kernel_checks);
  m.def("_list_ops", [] {
    py::list out;
    for (const auto& op : without_gil([] { return plugins::PluginRegistry::instance().ops(); })) {
      py::dict d;
      d["op"] = op.op;
      d["fallbacks"] = op.fallbacks;
      d["call_path"] = op.unboxed ? "unboxed" : "boxed";
      py::list layers;
      for (const auto& l : op.layers) {
        py::dict ld;
        ld["owner"] = l.owner;
        ld["kind"] = l.kind;
        ld["calls"] = l.calls;
        ld["declines"] = l.declines;
        ld["version_calls"] = l.version_calls;
        ld["version_declines"] = l.version_declines;
        layers.append(ld);
      }
      d["layers"] = layers;
      out.append(d);
    }
    return out;
  });
  m.def("_overload_to_serve", &dispatch::overload_to_serve);
  m.def("_inspect", [](const std::string& path) { return manifest_dict(plugins::PluginRegistry::inspect(path)); });
  py::class_<plugins::Watcher>(m, "_Watcher")
      .def(py::init([](const std::string& target, double debounce_seconds, std::string pattern, py::function on_ready) {
             // The callable is called and finally dropped on other threads: both under the GIL.
             std::shared_ptr<py::function> fn(new py::function(std::move(on_ready)), [](py::function* f) {
               py::gil_scoped_acquire gil;
               delete f;
             });
             try {
               return std::make_unique<plugins::Watcher>(
                   target, std::chrono::milliseconds(static_cast<int64_t>(debounce_seconds * 1000)),
                   std::move(pattern), [fn](const std::string& path) {
                     py::gil_scoped_acquire gil;
                     try {
                       return (*fn)(fs_str(path)).cast<bool>();
                     } catch (py::error_already_set& e) {
                       log::error("watch: " + path + ": " + e.what());
                       return true;
                     }
                   });
             } catch (const std::runtime_error& e) {
               throw py::value_error(e.what());
             }
           }),
           py::arg("target"), py::arg("debounce_seconds"), py::arg("pattern"), py::arg("on_ready"))
      .def("stop", &plugins::Watcher::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("directory", [](const plugins::Watcher& w) { return fs_str(w.directory()); });
  m.def("_trial_open", [](const std::string& path, const std::string& name) {
    without_gil([&] { plugins::PluginRegistry::trial_open(path, name); });
  });
  m.def("_abandon_change_after_fork", [] { plugins::PluginRegistry::instance().abandon_change_after_fork(); });
  m.def("_remove_snapshot_directory", &plugins::remove_own_snapshot_directory);
  m.def("_snapshot_directory", [] { return fs_str(plugins::snapshot_directory()); });
  m.attr("ABI_VERSION") = std::to_string(MAXDEV_ABI_MAJOR) + "." + std::to_string(MAXDEV_ABI_MINOR);

  // PluginError crosses as (kind, file, plugin, op, message); the package
  // turns it into the matching max_device.PluginError subclass.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const plugins::PluginError& e) {
      py::object errors = py::module_::import("max_device.errors");
      py::object error = errors.attr("_from_loader")(plugins::error_kind_name(e.kind()), fs_str(e.what()),
                                                     fs_str(e.file()), e.plugin(), e.op());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    }
  });
}

}  // namespace
}  // namespace maxdev::python

PYBIND11_MODULE(_C, m) {
  m.doc() = "max_device loader bindings (internal; use the max_device package)";
  maxdev::python::bind_device(m);
  maxdev::python::bind_streams(m);
  maxdev::python::bind_sharing(m);
  maxdev::python::bind_fallback(m);
  maxdev::python::bind_log(m);
  maxdev::python::bind_plugins(m);
}
