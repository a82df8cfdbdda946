"""Direct fallbacks: the functional and in-place forms of PyTorch's
structured ops (torch.hypot, x.hypot_) run the CPU's kernel of the form
called, zero copy, instead of PyTorch's composite (which allocates on the
device and calls hypot.out), until a provider serves the form or its out= op.

The ops used here (hypot, atan2, copysign) are served by no plugin or
override elsewhere in the suite: ending a direct fallback is for the life of
the process."""

import threading
import time

import torch

import max_device
from max_device import _C
from max_device._structured import _delegates

DEVICE = "max_device"


def pair(shape_a=(3, 4), shape_b=(4,)):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(*shape_a, generator=g), torch.randn(*shape_b, generator=g)
    return a, b, a.to(DEVICE), b.to(DEVICE)


def test_every_structured_form_with_a_cpu_kernel_falls_back_directly():
    """The loader finds each form's out= op from the schemas; PyTorch's
    native_functions.yaml (structured_delegate) is the reference."""
    direct = set(_C._direct_fallback_ops())

    def has_device_kernel(op):  # a provider, or max_device's own route (all.dims_out), ended these
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1") and op not in direct

    expected = {form for out, forms in _delegates().items() if not has_device_kernel(out) for form in forms
                if not has_device_kernel(form) and torch._C._dispatch_has_kernel_for_dispatch_key(form, "CPU")}
    assert len(expected) > 300
    assert expected - direct == set()
    # out= ops fall back as themselves: with a kernel of their own where their
    # signature is one of the unboxed ones (test_unboxed_fallback.py)
    # (minimum.out: served by nothing in the suite, so still in place)
    assert "aten::minimum.out" in direct and "aten::cumsum.out" not in direct


def test_forms_compute_what_the_cpu_computes_as_the_form_called():
    a, b, da, db = pair()
    result = torch.hypot(da, db)  # broadcast [3, 4] with [4]
    assert result.device.type == DEVICE and result.shape == (3, 4)
    torch.testing.assert_close(result.cpu(), torch.hypot(a, b), rtol=0, atol=0)
    assert max_device.fallback_counts() == {"aten::hypot": 1}  # no device allocation, no hypot.out

    x = da.clone()
    assert x.hypot_(db) is x  # in place: the argument itself comes back
    torch.testing.assert_close(x.cpu(), torch.hypot(a, b), rtol=0, atol=0)
    assert max_device.fallback_counts()["aten::hypot_"] == 1

    ints, floats = torch.arange(4).to(DEVICE), torch.full((4,), 0.5).to(DEVICE)
    promoted = torch.atan2(ints, floats)  # type promotion, as the CPU's kernel decides
    assert promoted.dtype == torch.float32
    torch.testing.assert_close(promoted.cpu(), torch.atan2(torch.arange(4), torch.full((4,), 0.5)))

    transposed = torch.copysign(da.t(), db.unsqueeze(1))  # strided inputs keep the CPU's output layout
    expected = torch.copysign(a.t(), b.unsqueeze(1))
    assert transposed.stride() == expected.stride()
    torch.testing.assert_close(transposed.cpu(), expected, rtol=0, atol=0)


def test_errors_are_the_cpu_kernels():
    _, _, da, _ = pair()
    try:
        torch.hypot(da, torch.ones(5, device=DEVICE))
    except RuntimeError as e:
        message = str(e)
    assert "must match the size" in message
    x = da.clone()
    before = x.cpu()
    try:
        x.hypot_(torch.ones(2, 3, 4, device=DEVICE))  # an in-place result cannot broadcast
    except RuntimeError:
        pass
    assert torch.equal(x.cpu(), before)


def test_a_provider_of_the_out_op_serves_the_forms_from_then_on():
    a, b, da, db = pair()
    seen = []

    def hypot_out(self, other, *, out):
        seen.append(tuple(out.shape))
        return NotImplemented  # the CPU fallback below computes it

    assert "aten::hypot" in _C._direct_fallback_ops()
    with max_device.override("aten::hypot.out", hypot_out):
        assert {"aten::hypot", "aten::hypot_"} & set(_C._direct_fallback_ops()) == set()
        result = torch.hypot(da, db)  # PyTorch's composite: allocate, then hypot.out
        da.clone().hypot_(db)
    assert seen == [(3, 4), (3, 4)]
    torch.testing.assert_close(result.cpu(), torch.hypot(a, b), rtol=0, atol=0)
    assert max_device.fallback_counts()["aten::hypot.out"] == 2
    # the override left; the composite stays (it reaches whatever serves hypot.out next)
    torch.hypot(da, db)
    assert max_device.fallback_counts()["aten::hypot.out"] == 3


def test_a_provider_of_the_form_itself_replaces_its_direct_fallback():
    a, b, da, db = pair()
    with max_device.override("aten::atan2", lambda self, other: torch.full_like(self, 7.0)):
        assert "aten::atan2" not in _C._direct_fallback_ops()
        assert "aten::atan2_" in _C._direct_fallback_ops()  # the in-place form is another op
        assert torch.atan2(da, db).cpu().eq(7.0).all()
    # no provider left: the slot's own fallback, still the form called
    torch.testing.assert_close(torch.atan2(da, db).cpu(), torch.atan2(a, b), rtol=0, atol=0)
    assert max_device.fallback_counts()["aten::atan2"] == 1


def test_ending_a_direct_fallback_while_other_threads_call_the_form():
    """Threads call copysign (direct fallback) while the main thread makes
    copysign.out served, which ends the direct fallbacks under them: every
    result stays right, nothing crashes."""
    a, b, da, db = pair((64,), (64,))
    expected = torch.copysign(a, b)
    stop, errors, calls = threading.Event(), [], [0, 0]

    def caller(i):
        try:
            while not stop.is_set():
                if not torch.equal(torch.copysign(da, db).cpu(), expected):
                    errors.append("wrong result")
                calls[i] += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    while min(calls) < 50:
        time.sleep(0.001)
    with max_device.override("aten::copysign.out", lambda self, other, *, out: NotImplemented):
        start = list(calls)
        while min(c - s for c, s in zip(calls, start)) < 50:
            time.sleep(0.001)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert "aten::copysign" not in _C._direct_fallback_ops()


def test_a_torch_library_kernel_for_the_out_op_is_reached_by_the_forms():
    """The RFC-0046 approach, a kernel registered with torch.library on the
    device key for an out= op, sees functional and in-place calls as on any
    device: the registration ends the forms' direct fallbacks."""
    a, b, da, db = pair()
    seen = []

    def fmod_out(self, other, *, out):
        seen.append(tuple(out.shape))
        out.copy_(torch.fmod(self.cpu(), other.cpu()))
        return out

    assert "aten::fmod.Tensor" in _C._direct_fallback_ops()
    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("fmod.Tensor_out", fmod_out, "PrivateUse1")
        assert {"aten::fmod.Tensor", "aten::fmod_.Tensor"} & set(_C._direct_fallback_ops()) == set()
        result = torch.fmod(da, db)
        da.clone().fmod_(db)
    finally:
        lib._destroy()
    assert seen == [(3, 4), (3, 4)]
    torch.testing.assert_close(result.cpu(), torch.fmod(a, b), rtol=0, atol=0)
