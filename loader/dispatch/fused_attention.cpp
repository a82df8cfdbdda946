// Fused scaled_dot_product_attention on max_device.
//
// PyTorch asks each device which SDPA backend to run (_fused_sdp_choice_stub)
// and sends the "overrideable" choice to _scaled_dot_product_fused_attention_
// overrideable (+ _backward). Those ops return SymInts, which the plugin ABI
// cannot carry, so max_device serves them itself by calling the tensor-only
// fused op of the CPU, aten::_scaled_dot_product_flash_attention_for_cpu
// (+ _backward), on max_device tensors: a plugin that serves that op gets
// every eligible SDPA call, and a declined call runs the CPU's flash kernel
// through the zero-copy fallback. Without such a provider SDPA takes the
// path the CPU would take on the same tensors: the CPU's flash kernel (by
// the same route) where the CPU picks it, else the math path, so results
// are the CPU's bit for bit (the math path rounds float16/bfloat16 scores
// differently).
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "dispatch/epoch.h"
#include "dispatch/op_table.h"

namespace maxdev::dispatch {
namespace {

constexpr const char* kFusedAttentionOp = "aten::_scaled_dot_product_flash_attention_for_cpu";

bool has_provider(const std::string& op) {
  for (const OpSlot* slot : OpTable::instance().slots()) {
    if (slot->name != op) continue;
    ReadGuard guard;
    const DispatchTable* table = OpTable::instance().current();
    return slot->index < table->stacks.size() && !table->stacks[slot->index].empty();
  }
  return false;
}

// The CPU's own choice reads only the tensors' metadata, so it takes
// max_device tensors as they are. It raises where the CPU has no viable
// backend: then the flash kernel is not it either.
bool cpu_picks_flash(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                     const std::optional<at::Tensor>& attn_mask, bool is_causal, std::optional<double> scale,
                     bool enable_gqa) {
  try {
    return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa) ==
           static_cast<int64_t>(at::SDPBackend::flash_attention);
  } catch (const c10::Error&) {
    return false;
  }
}

// The fused op has no dropout, no gradient for the mask and no grouped
// query heads: those calls take the math path.
int64_t choose_sdp_backend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                           std::optional<double> scale, bool enable_gqa) {
  const auto& context = at::globalContext();
  const bool eligible = dropout_p == 0.0 && !(attn_mask.has_value() && attn_mask->requires_grad()) &&
                        !(enable_gqa && query.dim() == 4 && key.dim() == 4 && query.size(1) != key.size(1));
  if (context.userEnabledOverrideableSDP() && eligible &&
      (has_provider(kFusedAttentionOp) || cpu_picks_flash(query, key, value, attn_mask, is_causal, scale, enable_gqa))) {
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  }
  if (context.userEnabledMathSDP()) return static_cast<int64_t>(at::SDPBackend::math);
  return static_cast<int64_t>(at::SDPBackend::error);
}

at::Tensor nothing_like(const at::Tensor& t) { return at::empty({0}, t.options()); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor,
           at::Tensor>
fused_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                bool /*return_debug_mask*/, std::optional<double> scale) {
  auto [out, logsumexp] =
      at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_bias, scale);
  const auto none = nothing_like(query);
  return {std::move(out), std::move(logsumexp), none, none, query.sym_size(-2), key.sym_size(-2), none, none,
          none};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> /*grad_input_mask*/, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p,
    bool is_causal, const at::Tensor&, const at::Tensor&, std::optional<double> scale) {
  const std::optional<at::Tensor> mask = attn_bias.defined() ? std::optional(attn_bias) : std::nullopt;
  auto [grad_query, grad_key, grad_value] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, mask, scale);
  return {std::move(grad_query), std::move(grad_key), std::move(grad_value), at::Tensor()};
}

}  // namespace
}  // namespace maxdev::dispatch

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &maxdev::dispatch::choose_sdp_backend)
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(maxdev::dispatch::fused_attention));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         TORCH_FN(maxdev::dispatch::fused_attention_backward));
}
