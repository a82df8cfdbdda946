// Fused LSTM and GRU cells of max_device.
//
// nn.LSTM / nn.GRU / LSTMCell / GRUCell on any device but the CPU call
// aten::_thnn_fused_lstm_cell / _thnn_fused_gru_cell (and their backward
// ops), which only CUDA implements: the CPU fallback has no kernel to run.
// These kernels compose them from pointwise ops on max_device tensors (each
// runs through the usual dispatch), with the workspace layout CUDA uses, so
// the autograd formulas PyTorch registers for the fused cells apply as is.
#include <ATen/core/Tensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

namespace maxdev::device {
namespace {

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

// Gates i, f, g, o of shape (N, 4H); workspace = the activated gates.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  const auto gates = with_bias(with_bias(input_gates, input_bias) + hidden_gates, hidden_bias).chunk(4, 1);
  const auto i = gates[0].sigmoid();
  const auto f = gates[1].sigmoid();
  const auto g = gates[2].tanh();
  const auto o = gates[3].sigmoid();
  auto cy = f * cx + i * g;
  auto hy = o * cy.tanh();
  return {std::move(hy), std::move(cy), at::cat({i, f, g, o}, 1)};
}

// Returns (grad of the pre-activation gates, grad_cx, grad_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  const auto gates = workspace.chunk(4, 1);
  const auto &i = gates[0], &f = gates[1], &g = gates[2], &o = gates[3];
  const auto tanh_cy = cy.tanh();
  const bool has_grad_hy = grad_hy.has_value() && grad_hy->defined();
  const bool has_grad_cy = grad_cy.has_value() && grad_cy->defined();
  at::Tensor grad_c = has_grad_cy ? *grad_cy : at::zeros_like(cy);
  at::Tensor grad_o = at::zeros_like(o);
  if (has_grad_hy) {
    grad_c = grad_c + *grad_hy * o * (1 - tanh_cy * tanh_cy);
    grad_o = *grad_hy * tanh_cy;
  }
  auto grad_gates = at::cat({grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f), grad_c * i * (1 - g * g),
                             grad_o * o * (1 - o)},
                            1);
  auto grad_cx = grad_c * f;
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {std::move(grad_gates), std::move(grad_cx), std::move(grad_bias)};
}

// Gates r, z, n of shape (N, 3H); workspace = r, z, n, hx and the hidden
// gate n (with its bias), as on CUDA.
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx,
                                                  const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  const auto in = with_bias(input_gates, input_bias).chunk(3, 1);
  const auto hid = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  const auto r = (in[0] + hid[0]).sigmoid();
  const auto z = (in[1] + hid[1]).sigmoid();
  const auto n = (in[2] + r * hid[2]).tanh();
  auto hy = n + z * (hx - n);
  return {std::move(hy), at::cat({r, z, n, hx, hid[2]}, 1)};
}

// Returns (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  const auto parts = workspace.chunk(5, 1);
  const auto &r = parts[0], &z = parts[1], &n = parts[2], &hx = parts[3], &hidden_n = parts[4];
  const auto grad_n = grad_hy * (1 - z) * (1 - n * n);
  const auto grad_z = grad_hy * (hx - n) * z * (1 - z);
  const auto grad_r = grad_n * hidden_n * r * (1 - r);
  auto grad_input_gates = at::cat({grad_r, grad_z, grad_n}, 1);
  auto grad_hidden_gates = at::cat({grad_r, grad_z, grad_n * r}, 1);
  auto grad_hx = grad_hy * z;
  at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {std::move(grad_input_gates), std::move(grad_hidden_gates), std::move(grad_hx),
          std::move(grad_input_bias), std::move(grad_hidden_bias)};
}

}  // namespace
}  // namespace maxdev::device

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace maxdev::device;
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}
