"""Ops whose CPU kernel would lose to a CompositeExplicitAutograd kernel on
max_device run the CPU's kernel (loader/dispatch/cpu_fallback.cpp,
register_cpu_kernel_routes), so they compute what the CPU computes, bit for
bit: the composite kernels round float16/bfloat16 differently. Two
composites the CPU shares run as the CPU's too: conj_physical_ (it calls a
DispatchStub) and addr_ (it relies on a C++ object's address)."""

import pytest
import torch
import torch.nn.functional as F

import max_device

DEVICE = "max_device"


def composite_over_cpu_kernel():
    """aten ops with a CPU kernel of their own whose max_device entry is a
    CompositeExplicitAutograd kernel (structured kernels' NonFunctional
    wrappers call the device's out= kernel, the CPU's, and are fine)."""
    found = []
    for op in torch._C._dispatch_get_all_op_names():
        if not op.startswith("aten::"):
            continue
        entries = dict(line.split(": ", 1) for line in torch._C._dispatch_dump_table(op).splitlines()
                       if ": " in line)
        if "[kernel]" in entries.get("CPU", "") and \
                "RegisterCompositeExplicitAutograd_" in entries.get("PrivateUse1", ""):
            found.append(op)
    return sorted(found)


def test_no_composite_kernel_wins_over_the_cpus():
    assert composite_over_cpu_kernel() == []


def test_group_norm_is_the_cpus_in_half_precision():
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(4, 6, 5, 7, dtype=dtype) * 3 + 1
        weight, bias = torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)
        max_device.reset_fallback_counts()
        out = F.group_norm(x.to(DEVICE), 3, weight.to(DEVICE), bias.to(DEVICE))
        assert max_device.fallback_counts().get("aten::native_group_norm") == 1
        assert torch.equal(out.cpu(), F.group_norm(x, 3, weight, bias)), dtype


def test_addr_is_the_cpus_functional_out_and_in_place():
    torch.manual_seed(0)
    m, u, v = torch.randn(9, 11, dtype=torch.float16), torch.randn(9, dtype=torch.float16), \
        torch.randn(11, dtype=torch.float16)
    expected = torch.addr(m, u, v, beta=0.5, alpha=3)
    d = [t.to(DEVICE) for t in (m, u, v)]
    assert torch.equal(torch.addr(*d, beta=0.5, alpha=3).cpu(), expected)
    out = torch.empty(0, dtype=torch.float16, device=DEVICE)
    assert torch.addr(*d, beta=0.5, alpha=3, out=out) is out and torch.equal(out.cpu(), expected)
    d[0].addr_(d[1], d[2], beta=0.5, alpha=3)
    assert torch.equal(d[0].cpu(), expected)
    # addr_ never broadcasts self (addr.out's CPU kernel checks self is out=
    # by the C++ object's address): a 0-d self is an error, as on the CPU.
    for device in ("cpu", DEVICE):
        with pytest.raises(RuntimeError, match="2D tensor expected, got 0D tensor for input"):
            torch.tensor(2.0, device=device).addr_(u.to(device), v.to(device))


def test_conj_physical_in_place_and_complex_svd_out():
    # conj_physical_'s composite kernel calls a DispatchStub directly (no
    # max_device kernel); svd(out=) of a complex matrix calls it.
    torch.manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.complex64)
    d = x.to(DEVICE)
    assert d.conj_physical_() is d and torch.equal(d.cpu(), x.conj_physical())
    outs = tuple(torch.empty(0, dtype=t, device=DEVICE) for t in (torch.complex64, torch.float32, torch.complex64))
    u, s, v = torch.svd(x.to(DEVICE), out=outs)
    assert u is outs[0] and v is outs[2]
    torch.testing.assert_close((u * s.to(u.dtype)) @ v.mH, x.to(DEVICE))
