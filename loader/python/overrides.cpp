#include "python/overrides.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <algorithm>
#include <vector>

namespace py = pybind11;

namespace maxdev::python {
namespace {

class PythonOverride final : public dispatch::Provider {
 public:
  PythonOverride(py::object fn, const std::string& label)
      : Provider("override:" + label, "override"), fn_(new py::object(std::move(fn))) {}

  ~PythonOverride() override {
    // The last reference may go from a thread without the GIL.
    py::gil_scoped_acquire gil;
    delete fn_;
  }

  bool run(const dispatch::OpSlot& slot, torch::jit::Stack* stack) override {
    thread_local std::vector<const PythonOverride*> running;
    if (std::find(running.begin(), running.end(), this) != running.end()) return false;
    running.push_back(this);
    struct Pop {
      ~Pop() { running.pop_back(); }
    } pop;

    const auto& schema = slot.op.schema();
    const size_t n = schema.arguments().size();
    py::gil_scoped_acquire gil;
    py::list positional;
    py::dict keywords;
    auto args = torch::jit::last(*stack, n);
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
      result = (*fn_)(*positional, **keywords);
    } catch (py::error_already_set& e) {
      e.restore();
      throw python_error();
    }
    if (result.ptr() == Py_NotImplemented) {
      declines.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    calls.fetch_add(1, std::memory_order_relaxed);
    const auto& returns = schema.returns();
    std::vector<c10::IValue> values;
    if (returns.size() == 1) {
      values.push_back(torch::jit::toIValue(result, returns[0].real_type()));
    } else {
      py::tuple tuple = result.cast<py::tuple>();
      TORCH_CHECK(tuple.size() == returns.size(), "max_device override ", owner(), " for ", slot.name,
                  " returned ", tuple.size(), " values; the op returns ", returns.size());
      for (size_t i = 0; i < returns.size(); ++i) values.push_back(torch::jit::toIValue(tuple[i], returns[i].real_type()));
    }
    torch::jit::drop(*stack, n);
    for (auto& v : values) stack->push_back(std::move(v));
    return true;
  }

 private:
  py::object* fn_;  // deleted under the GIL
};

}  // namespace

std::shared_ptr<dispatch::Provider> make_python_override(py::object fn, const std::string& label) {
  return std::make_shared<PythonOverride>(std::move(fn), label);
}

}  // namespace maxdev::python
