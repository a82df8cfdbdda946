"""Recurrent layers on max_device match the CPU, forward and backward, as
OpenReg's RNN tests check them. On any device but the CPU PyTorch runs
LSTM/GRU steps as the fused cells (_thnn_fused_lstm_cell / _gru_cell),
which max_device composes from pointwise ops (loader/device/rnn.cpp)."""

import copy

import pytest
import torch
from torch import nn

import max_device

DEVICE = "max_device"


class _WithState(nn.Module):
    """An RNN called with an initial state given as separate inputs."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h, c=None):
        return self.rnn(x, h if c is None else (h, c))


def compare_with_cpu(module, *inputs):
    """Run `module` on the CPU and a copy on max_device; outputs and every
    gradient (parameters and inputs) must match."""
    torch.manual_seed(0)
    cpu_inputs = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    dev_module = copy.deepcopy(module).to(DEVICE)
    dev_inputs = [t.detach().to(DEVICE).requires_grad_(t.is_floating_point()) for t in inputs]

    def flat(out):
        if isinstance(out, torch.Tensor):
            return [out]
        return [t for item in out for t in flat(item)]

    cpu_out = flat(module(*cpu_inputs))
    dev_out = flat(dev_module(*dev_inputs))
    assert all(t.device.type == DEVICE for t in dev_out)
    for c, d in zip(cpu_out, dev_out):
        torch.testing.assert_close(d.cpu(), c)
    sum(o.sum() * (i + 1) for i, o in enumerate(cpu_out)).backward()
    sum(o.sum() * (i + 1) for i, o in enumerate(dev_out)).backward()
    for (name, p_cpu), p_dev in zip(module.named_parameters(), dev_module.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, msg=f"grad of {name}")
    for c, d in zip(cpu_inputs, dev_inputs):
        if c.requires_grad:
            torch.testing.assert_close(d.grad.cpu(), c.grad)


@pytest.mark.parametrize("kwargs", [
    {}, {"bias": False}, {"num_layers": 2}, {"bidirectional": True}, {"batch_first": True}, {"proj_size": 3},
], ids=["plain", "no_bias", "two_layers", "bidirectional", "batch_first", "proj"])
def test_lstm(kwargs):
    torch.manual_seed(1)
    compare_with_cpu(nn.LSTM(4, 5, **kwargs), torch.randn(6, 3, 4))


def test_lstm_with_initial_state():
    torch.manual_seed(2)
    lstm = nn.LSTM(4, 5)
    h0, c0 = torch.randn(1, 3, 5), torch.randn(1, 3, 5)
    compare_with_cpu(_WithState(lstm), torch.randn(6, 3, 4), h0, c0)


@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"num_layers": 2, "bidirectional": True}],
                         ids=["plain", "no_bias", "two_layers_bidirectional"])
def test_gru(kwargs):
    torch.manual_seed(3)
    compare_with_cpu(nn.GRU(4, 5, **kwargs), torch.randn(6, 3, 4))


def test_gru_with_initial_state():
    torch.manual_seed(4)
    compare_with_cpu(_WithState(nn.GRU(4, 5)), torch.randn(6, 3, 4), torch.randn(1, 3, 5))


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell(bias):
    torch.manual_seed(5)
    compare_with_cpu(nn.LSTMCell(4, 5, bias=bias), torch.randn(3, 4))


@pytest.mark.parametrize("bias", [True, False])
def test_gru_cell(bias):
    torch.manual_seed(6)
    compare_with_cpu(nn.GRUCell(4, 5, bias=bias), torch.randn(3, 4), torch.randn(3, 5))


def test_plain_rnn():
    torch.manual_seed(7)
    compare_with_cpu(nn.RNN(4, 5, nonlinearity="relu"), torch.randn(6, 3, 4))


def test_double_backward_through_lstm_cell():
    # create_graph: PyTorch switches to the differentiable cell formulas
    torch.manual_seed(8)
    cell = nn.LSTMCell(3, 2).to(DEVICE)
    x = torch.randn(2, 3, device=DEVICE, requires_grad=True)
    h, _ = cell(x)
    (grad_x,) = torch.autograd.grad(h.sum(), x, create_graph=True)
    grad_x.sum().backward()
    assert x.grad is not None and x.grad.device.type == DEVICE


def test_lstm_under_autocast():
    torch.manual_seed(9)
    lstm = nn.LSTM(4, 5).to(DEVICE)
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        out, _ = lstm(torch.randn(6, 3, 4, device=DEVICE))
    assert out.dtype == torch.bfloat16


def test_fused_cells_are_max_devices_own():
    # Plugins serve the pointwise ops the cells are made of, not the cells.
    with pytest.raises(max_device.SchemaError, match="served natively by max_device"):
        max_device.override("aten::_thnn_fused_lstm_cell", lambda *args: NotImplemented)
