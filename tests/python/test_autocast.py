"""torch.autocast on max_device and torch.utils.checkpoint (which reads the
autocast state), as OpenReg's autocast tests check them. max_device
registers the op lists PyTorch shares between accelerators (CUDA's and
XPU's): matmuls in the autocast dtype, reductions and losses in float32."""

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import max_device  # noqa: F401

DEVICE = "max_device"


def test_fast_dtype_and_supported_dtypes():
    assert torch.get_autocast_dtype(device_type=DEVICE) == torch.float16
    assert torch.amp.is_autocast_available(DEVICE)


def test_unsupported_dtype_warns_and_disables():
    with pytest.warns(UserWarning, match="In max_device autocast, but the target dtype is not supported"):
        with torch.autocast(device_type=DEVICE, dtype=torch.float32):
            assert torch.ones(1, device=DEVICE).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lower_precision_ops(dtype):
    x = torch.randn(2, 3, device=DEVICE)
    w = torch.randn(3, 3, device=DEVICE)
    with torch.autocast(device_type=DEVICE, dtype=dtype):
        assert torch.is_autocast_enabled(DEVICE)
        assert torch.mm(x, w).dtype == dtype
        assert torch.nn.functional.linear(x, w).dtype == dtype
        assert (x @ w).dtype == dtype
        assert (x + x).dtype == torch.float32  # not listed: untouched
    assert torch.mm(x, w).dtype == torch.float32
    ref = (x.cpu().to(dtype) @ w.cpu().to(dtype))
    with torch.autocast(device_type=DEVICE, dtype=dtype):
        torch.testing.assert_close(torch.mm(x, w).cpu(), ref)


def test_float32_ops():
    x = torch.rand(4, device=DEVICE, dtype=torch.float16) + 0.5
    with torch.autocast(device_type=DEVICE):
        assert torch.exp(x).dtype == torch.float32
        assert torch.log(x).dtype == torch.float32
        assert torch.softmax(x, 0).dtype == torch.float32
        assert x.sum().dtype == torch.float32


def test_promote_ops():
    a = torch.randn(3, device=DEVICE, dtype=torch.float16)
    b = torch.randn(3, device=DEVICE)
    with torch.autocast(device_type=DEVICE):
        assert torch.addcmul(a, a, b).dtype == torch.float32


def test_autocast_backward_gives_float32_grads():
    w = torch.randn(4, 4, device=DEVICE, requires_grad=True)
    x = torch.randn(2, 4, device=DEVICE)
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        loss = (x @ w).float().pow(2).sum()
    loss.backward()
    assert w.grad.dtype == torch.float32 and w.grad.device.type == DEVICE


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(3, device=DEVICE)
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(p, p)


def block(x, w):
    return torch.tanh(x @ w).sin()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_matches_plain_backward(use_reentrant):
    torch.manual_seed(0)
    w_cpu = torch.randn(8, 8)
    x_cpu = torch.randn(4, 8)
    w = w_cpu.to(DEVICE).requires_grad_()
    x = x_cpu.to(DEVICE).requires_grad_()
    checkpoint(block, x, w, use_reentrant=use_reentrant).sum().backward()
    w_ref = w_cpu.clone().requires_grad_()
    x_ref = x_cpu.clone().requires_grad_()
    block(x_ref, w_ref).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), w_ref.grad)
    torch.testing.assert_close(x.grad.cpu(), x_ref.grad)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_under_autocast_recomputes_in_the_same_dtype(use_reentrant):
    w = torch.randn(8, 8, device=DEVICE, requires_grad=True)
    x = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        out = checkpoint(block, x, w, use_reentrant=use_reentrant)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert w.grad.dtype == torch.float32


def test_checkpoint_restores_device_rng_for_dropout():
    x = torch.randn(64, device=DEVICE, requires_grad=True)

    def noisy(t):
        return torch.nn.functional.dropout(t, 0.5, training=True) * 2

    torch.max_device.manual_seed(0)
    checkpoint(noisy, x, use_reentrant=False).sum().backward()
    recomputed = x.grad.clone()
    x.grad = None
    torch.max_device.manual_seed(0)
    noisy(x).sum().backward()
    torch.testing.assert_close(recomputed.cpu(), x.grad.cpu())
