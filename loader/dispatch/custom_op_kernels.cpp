#include "dispatch/custom_op_kernels.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include "common/log.h"
#include "dispatch/epoch.h"

namespace maxdev::dispatch {
namespace {

// The first provider of the slot's op, top down, for which `pick` returns true.
template <typename Pick>
void for_providers(const OpSlot& slot, Pick&& pick) {
  ReadGuard guard;
  const DispatchTable* table = OpTable::instance().current();
  if (slot.index >= table->stacks.size()) return;
  const ProviderStack& providers = table->stacks[slot.index];
  for (auto it = providers.rbegin(); it != providers.rend(); ++it) {
    if (pick(**it)) return;
  }
}

class MetaKernel final : public c10::OperatorKernel {
 public:
  explicit MetaKernel(const OpSlot* slot) : slot_(slot) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    bool done = false;
    for_providers(*slot_, [&](Provider& p) { return done = p.run_meta(*slot_, stack); });
    TORCH_CHECK_NOT_IMPLEMENTED(done, "max_device: ", slot_->name,
                                " has no meta function: no plugin serving it gives one "
                                "(maxdev_kernel_def.meta), and none was registered with torch.library.register_fake");
  }

 private:
  const OpSlot* slot_;
};

c10::OperatorName split(const std::string& op) {
  const auto dot = op.find('.', op.find("::") + 2);
  return dot == std::string::npos ? c10::OperatorName(op, "") : c10::OperatorName(op.substr(0, dot), op.substr(dot + 1));
}

// The gradient node of one call: calls the backward op with the output
// gradients and the forward's arguments (tensors detached).
class PluginBackward final : public torch::autograd::Node {
 public:
  PluginBackward(std::string forward, std::string backward, std::vector<c10::IValue> args)
      : forward_(std::move(forward)), backward_(std::move(backward)), args_(std::move(args)) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(!backward_.empty(), "max_device: ", forward_, " has no gradient: the plugin serving it names no "
                "backward op (maxdev_kernel_def.backward); register one with torch.library.register_autograd");
    TORCH_CHECK(!args_.empty() || num_inputs() == 0, "max_device: ", forward_,
                ": backward called twice (its saved arguments were released; use retain_graph=True)");
    auto op = c10::Dispatcher::singleton().findSchema(split(backward_));
    TORCH_CHECK(op.has_value(), "max_device: ", forward_, "'s backward op ", backward_, " is not defined");
    torch::jit::Stack stack;
    for (size_t i = 0; i < grads.size(); ++i) {
      stack.emplace_back(grads[i].defined() ? grads[i] : input_metadata(i).zeros_like());
    }
    for (const auto& a : args_) stack.push_back(a);
    op->callBoxed(&stack);
    torch::autograd::variable_list out(num_outputs());
    for (size_t i = 0; i < out.size() && i < stack.size(); ++i) {
      if (stack[i].isTensor()) out[i] = stack[i].toTensor();
    }
    return out;
  }
  std::string name() const override { return forward_ + "Backward"; }
  void release_variables() override { args_.clear(); }

 private:
  std::string forward_;
  std::string backward_;
  std::vector<c10::IValue> args_;
};

class AutogradKernel final : public c10::OperatorKernel {
 public:
  explicit AutogradKernel(const OpSlot* slot) : slot_(slot) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const size_t num_args = op.schema().arguments().size();
    std::vector<at::Tensor> inputs;
    std::vector<c10::IValue> saved;
    for (const auto& v : torch::jit::last(*stack, num_args)) {
      if (v.isTensor() && v.toTensor().defined()) {
        inputs.push_back(v.toTensor());
        saved.emplace_back(v.toTensor().detach());
      } else {
        saved.push_back(v);
      }
    }
    const bool needs_grad = torch::autograd::compute_requires_grad(inputs);
    {
      at::AutoDispatchBelowADInplaceOrView below;
      op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    }
    if (!needs_grad) return;
    std::string backward;
    for_providers(*slot_, [&](Provider& p) { return !(backward = p.backward_op()).empty(); });
    auto node = c10::make_intrusive<PluginBackward>(slot_->name, backward, std::move(saved));
    node->set_next_edges(torch::autograd::collect_next_edges(inputs));
    for (const auto& r : torch::jit::last(*stack, op.schema().returns().size())) {
      if (r.isTensor()) torch::autograd::set_history(r.toTensor(), node);
    }
  }

 private:
  const OpSlot* slot_;
};

}  // namespace

void add_custom_op_kernels(OpSlot& slot, bool meta, bool autograd) {
  if (!meta && !autograd) return;
  const std::string ns = slot.name.substr(0, slot.name.find("::"));
  const std::string local = slot.name.substr(ns.size() + 2);
  if (!slot.custom_op_kernels) {
    slot.custom_op_kernels =
        std::make_unique<torch::Library>(torch::Library::IMPL, ns, std::nullopt, __FILE__, __LINE__);
  }
  if (meta && !slot.has_meta_kernel) {
    slot.custom_op_kernels->impl(local.c_str(), torch::dispatch(c10::DispatchKey::Meta,
                                                                torch::CppFunction::makeFromBoxedFunctor(
                                                                    std::make_unique<MetaKernel>(&slot))));
    slot.has_meta_kernel = true;
  }
  if (autograd && !slot.has_autograd_kernel) {
    slot.custom_op_kernels->impl(local.c_str(), torch::dispatch(c10::DispatchKey::Autograd,
                                                                torch::CppFunction::makeFromBoxedFunctor(
                                                                    std::make_unique<AutogradKernel>(&slot))));
    slot.has_autograd_kernel = true;
  }
  log::debug("meta/autograd kernels registered for " + slot.name);
}

}  // namespace maxdev::dispatch
