"""scaled_dot_product_attention on max_device, as OpenReg's SDPA tests check
it: PyTorch asks max_device which backend to use and sends the fused choice
to _scaled_dot_product_fused_attention_overrideable (+ backward), which
max_device serves through aten::_scaled_dot_product_flash_attention_for_cpu
(+ backward): ops with tensor-only results that a plugin (or here a Python
override) can serve. Without a provider, SDPA takes the CPU's path: its
flash kernel where the CPU picks it (through the same route), else math.

Documented difference from OpenReg: the overrideable ops themselves return
SymInts, which the plugin ABI cannot carry, so plugins serve the CPU's
fused op instead."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import max_device

DEVICE = "max_device"
FUSED = "aten::_scaled_dot_product_flash_attention_for_cpu"
FUSED_BACKWARD = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"


def qkv(requires_grad=False):
    torch.manual_seed(0)
    return [torch.randn(1, 2, 4, 8, device=DEVICE, requires_grad=requires_grad) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_a_provider_the_cpus_flash_kernel_bit_for_bit(dtype):
    torch.manual_seed(0)
    q, k, v = [torch.randn(2, 3, 17, 16, dtype=dtype) for _ in range(3)]
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.profiler.profile() as prof:
        out = F.scaled_dot_product_attention(*(t.to(DEVICE) for t in (q, k, v)), is_causal=True)
    assert FUSED in {event.name for event in prof.events()}
    assert torch.equal(out.cpu(), ref)
    # (the math path rounds differently: these inputs tell the two apart)
    with sdpa_kernel(SDPBackend.MATH):
        assert not torch.equal(F.scaled_dot_product_attention(q, k, v, is_causal=True), ref)


def test_math_path_where_the_cpu_takes_it():
    _, k, v = qkv()
    q = torch.randn(1, 2, 8, 4, device=DEVICE).transpose(-1, -2)  # flash needs the last dim contiguous
    assert torch._fused_sdp_choice(q.cpu(), k.cpu(), v.cpu()) == SDPBackend.MATH.value
    with torch.profiler.profile() as prof:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert FUSED not in {event.name for event in prof.events()}
    assert torch.equal(out.cpu(), F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), is_causal=True))


def test_no_viable_backend_when_math_is_disabled_and_nothing_serves():
    q, k, v = qkv()
    with sdpa_kernel(SDPBackend.OVERRIDEABLE):
        with pytest.raises(RuntimeError, match="No viable backend"):
            F.scaled_dot_product_attention(q, k, v)


def fused_attention(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """A stand-in fused kernel: the math, returning what the op's schema asks."""
    calls.append("forward")
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    logsumexp = scores.logsumexp(-1)
    out = (scores - logsumexp[..., None]).exp() @ value
    return out, logsumexp


def fused_attention_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
                             scale=None):
    calls.append("backward")
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    probs = (query @ key.transpose(-2, -1) * scale - logsumexp[..., None]).exp()
    grad_value = probs.transpose(-2, -1) @ grad_out
    grad_probs = grad_out @ value.transpose(-2, -1)
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True)) * scale
    return grad_scores @ key, grad_scores.transpose(-2, -1) @ query, grad_value


calls = []


def test_a_provider_serves_forward_and_backward():
    calls.clear()
    q, k, v = qkv(requires_grad=True)
    with max_device.override(FUSED, fused_attention), max_device.override(FUSED_BACKWARD, fused_attention_backward):
        out = F.scaled_dot_product_attention(q, k, v)
        out.sum().backward()
    assert calls == ["forward", "backward"]
    q_ref, k_ref, v_ref = [t.detach().cpu().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(q_ref, k_ref, v_ref)
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref)
    for dev, cpu in ((q, q_ref), (k, k_ref), (v, v_ref)):
        torch.testing.assert_close(dev.grad.cpu(), cpu.grad)
    # The provider left: the math path again
    calls.clear()
    F.scaled_dot_product_attention(*qkv())
    assert calls == []


def test_a_declining_provider_runs_the_cpu_fused_kernel():
    calls.clear()
    q, k, v = qkv(requires_grad=True)

    def decline(*args, **kwargs):
        calls.append("declined")
        return NotImplemented

    with max_device.override(FUSED, decline), max_device.override(FUSED_BACKWARD, decline):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
    assert calls == ["declined", "declined"]
    q_ref, k_ref, v_ref = [t.detach().cpu().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(q_ref, k_ref, v_ref, is_causal=True).sum().backward()
    torch.testing.assert_close(q.grad.cpu(), q_ref.grad)


def test_dropout_takes_the_math_path():
    calls.clear()
    with max_device.override(FUSED, fused_attention):
        F.scaled_dot_product_attention(*qkv(), dropout_p=0.5)
    assert calls == []


def test_disabling_the_overrideable_backend_uses_math():
    calls.clear()
    with max_device.override(FUSED, fused_attention):
        with sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(*qkv())
    assert calls == []


def test_the_overrideable_ops_are_max_devices_own():
    with pytest.raises(max_device.SchemaError, match="served natively by max_device"):
        max_device.override("aten::_scaled_dot_product_fused_attention_overrideable", fused_attention)
