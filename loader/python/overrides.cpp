#include "python/overrides.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <algorithm>
#include <vector>

#include "dispatch/kernel_provider.h"

namespace py = pybind11;

namespace maxdev::python {
namespace {

// Whether the op takes a device argument (its results may be on another
// device than max_device, as with _to_copy).
bool takes_device(const c10::FunctionSchema& schema) {
  return std::any_of(schema.arguments().begin(), schema.arguments().end(), [](const c10::Argument& a) {
    const auto& type = a.real_type();
    return type->kind() == c10::TypeKind::DeviceObjType ||
           (type->kind() == c10::TypeKind::OptionalType &&
            type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::DeviceObjType);
  });
}

[[noreturn]] void wrong_result(const std::string& owner, const dispatch::OpSlot& slot, const std::string& what) {
  dispatch::throw_call_error("kernel", owner, slot.name, "",
                             "the Python override returned " + what + " (an override's result must be what the "
                             "op's schema and meta kernel say, as a kernel's)");
}

// An override's results against the op's schema and meta kernel: a wrong
// one would otherwise reach the caller as if PyTorch had made it.
void check_result(const std::string& owner, const dispatch::OpSlot& slot, c10::ArrayRef<c10::IValue> args,
                  const std::vector<c10::IValue>& values) {
  const auto& schema = slot.op.schema();
  std::optional<torch::jit::Stack> expected;
  bool meta_tried = false;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& type = schema.returns()[i].real_type();
    const std::string which = values.size() == 1 ? "" : " (result " + std::to_string(i) + ")";
    if (type->kind() != c10::TypeKind::TensorType) continue;
    if (!values[i].isTensor() || !values[i].toTensor().defined()) wrong_result(owner, slot, "None" + which + " where the op returns a Tensor");
    const at::Tensor& got = values[i].toTensor();
    const int alias = slot.sig.return_aliases[i];
    if (alias >= 0) {
      if (!args[static_cast<size_t>(alias)].isTensor() ||
          !got.is_same(args[static_cast<size_t>(alias)].toTensor())) {
        wrong_result(owner, slot, "a new tensor" + which + " where the op returns its argument '" +
                                      schema.arguments()[static_cast<size_t>(alias)].name() +
                                      "' (write into it and return it)");
      }
      continue;
    }
    if (got.device().type() != c10::DeviceType::PrivateUse1 && !takes_device(schema)) {
      wrong_result(owner, slot, "a tensor on " + got.device().str() + which + " where the op's result is on " +
                                    c10::get_privateuse1_backend() + " (move it with .to('" +
                                    c10::get_privateuse1_backend() + "'))");
    }
    if (!meta_tried) {
      expected = dispatch::meta_returns(slot, args);
      meta_tried = true;
    }
    if (!expected) continue;
    const at::Tensor& want = (*expected)[i].toTensor();
    if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) {
      wrong_result(owner, slot, dispatch::describe(got) + which + " where the op's meta kernel gives " +
                                    dispatch::describe(want));
    }
  }
}

class PythonOverride final : public dispatch::Provider {
 public:
  PythonOverride(py::object fn, const std::string& op, const std::string& label)
      : Provider("override:" + label, "override", dispatch::served_by_name(op, "override:" + label)),
        fn_(new py::object(std::move(fn))) {}

  ~PythonOverride() override {
    // The last reference may go from a thread without the GIL, or after
    // the interpreter is gone (a process exiting with an override still
    // installed): then the function object is left to the exiting process.
    if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
    py::gil_scoped_acquire gil;
    delete fn_;
  }

  bool run(const dispatch::CallArgs& call, dispatch::Returns& returns) override {
    thread_local std::vector<const PythonOverride*> running;
    if (std::find(running.begin(), running.end(), this) != running.end()) return false;
    running.push_back(this);
    struct Pop {
      ~Pop() { running.pop_back(); }
    } pop;

    const dispatch::OpSlot& slot = call.slot();
    const c10::ArrayRef<c10::IValue> args = call.boxed();
    const auto& schema = slot.op.schema();
    const size_t n = schema.arguments().size();
    py::gil_scoped_acquire gil;
    py::list positional;
    py::dict keywords;
    for (size_t i = 0; i < n; ++i) {
      py::object value = torch::jit::toPyObject(args[i]);
      if (schema.arguments()[i].kwarg_only()) {
        keywords[py::str(schema.arguments()[i].name())] = value;
      } else {
        positional.append(value);
      }
    }
    py::object result;
    try {
      dispatch::ServedBy range(served_by());
      result = (*fn_)(*positional, **keywords);
    } catch (py::error_already_set& e) {
      e.restore();
      throw python_error();
    }
    if (result.ptr() == Py_NotImplemented) {
      count_decline();
      return false;
    }
    count_call();
    const auto& schema_returns = schema.returns();
    std::vector<c10::IValue> values;
    auto convert = [&](py::handle value, size_t i) {
      if (value.is_none() && schema_returns[i].real_type()->kind() == c10::TypeKind::TensorType) {
        wrong_result(owner(), slot, "None where the op returns a Tensor");
      }
      try {
        values.push_back(torch::jit::toIValue(value, schema_returns[i].real_type()));
      } catch (const std::exception& e) {
        wrong_result(owner(), slot, std::string(py::str(py::type::of(value).attr("__name__"))) + " where the op "
                                    "returns " + schema_returns[i].real_type()->str() + ": " + e.what());
      }
    };
    if (schema_returns.size() == 1) {
      convert(result, 0);
    } else {
      if (!py::isinstance<py::tuple>(result) || py::len(result) != schema_returns.size()) {
        wrong_result(owner(), slot, std::string(py::str(py::repr(result))).substr(0, 80) + " where the op returns " +
                                        std::to_string(schema_returns.size()) + " values as a tuple");
      }
      py::tuple tuple = result.cast<py::tuple>();
      for (size_t i = 0; i < schema_returns.size(); ++i) convert(tuple[i], i);
    }
    check_result(owner(), slot, args, values);
    for (auto& v : values) returns.push_back(std::move(v));
    return true;
  }

 private:
  py::object* fn_;  // deleted under the GIL
};

}  // namespace

std::shared_ptr<dispatch::Provider> make_python_override(py::object fn, const std::string& op,
                                                         const std::string& label) {
  return std::make_shared<PythonOverride>(std::move(fn), op, label);
}

}  // namespace maxdev::python
