"""Unboxed fallbacks: an op with a common C++ signature (mm.out, add.out,
relu, addmm, the structured forms) has a fallback kernel of its own, which
the dispatcher calls with C++ arguments and which calls the CPU kernel
unboxed. It must compute, count, check and fail exactly as the boxed
fallback does, and step aside for any kernel someone registers.

The ops used here (UNTOUCHED, and dot, which one test takes over) are served by no plugin or override elsewhere in the suite:
replacing a fallback kernel is for the life of the process."""

import os
import warnings

import pytest
import torch

import max_device
from max_device import _C

from conftest import run_python

DEVICE = "max_device"


def active_kernel(op):
    """The debug name of the kernel that serves `op` on the device key."""
    for line in torch._C._dispatch_dump(op).splitlines():
        if line.startswith("PrivateUse1:"):
            return line.split(":", 1)[1].split("::")[0].strip()
    return None


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# Ops served by no plugin or override in the suite: their fallback kernels
# are still in place whatever ran before.
UNTOUCHED = ("aten::minimum.out", "aten::logaddexp", "aten::lerp_.Scalar", "aten::addbmm.out", "aten::sinh")


@pytest.fixture
def untouched():
    for op in UNTOUCHED:
        assert active_kernel(op) == "max_device unboxed CPU fallback", op


def test_common_signatures_get_an_unboxed_fallback_kernel():
    """In a fresh process (plugins in this one may have served mm.out):
    the ops a model calls most, and the forms too."""
    result = run_python("""
import torch, max_device
from max_device import _C
def active_kernel(op):
    lines = [l for l in torch._C._dispatch_dump(op).splitlines() if l.startswith("PrivateUse1:")]
    return lines[0].split(":", 1)[1].split("::")[0].strip() if lines else None
direct = set(_C._direct_fallback_ops())
for op in ("aten::mm.out", "aten::addmm.out", "aten::bmm.out", "aten::add.out", "aten::relu",
           "aten::mm", "aten::add.Tensor", "aten::add_.Tensor"):
    assert op in direct and active_kernel(op) == "max_device unboxed CPU fallback", op
# other signatures: the boxed fallback, as a form's kernel or the global one
assert active_kernel("aten::cumsum") == "max_device direct CPU fallback"
assert "aten::cumsum.out" not in direct and active_kernel("aten::cumsum.out") is None
a = torch.randn(4, 4)
out = torch.empty(4, 4, device="max_device")
torch.mm(a.to("max_device"), a.to("max_device"), out=out)
assert torch.equal(out.cpu(), torch.mm(a, a))
assert max_device.fallback_counts() == {"aten::mm.out": 1}
print("ok")
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_results_and_counts_match_the_cpu(untouched, dtype):
    a, b = (randn(5, 7, seed=1) * 4).to(dtype), (randn(5, 7, seed=2) * 4).to(dtype)
    da, db = a.to(DEVICE), b.to(DEVICE)
    out = torch.empty(5, 7, dtype=dtype, device=DEVICE)
    assert torch.minimum(da, db, out=out) is out
    torch.testing.assert_close(out.cpu(), torch.minimum(a, b), rtol=0, atol=0)
    batches = (randn(3, 5, 4, seed=3) * 4).to(dtype), (randn(3, 4, 7, seed=4) * 4).to(dtype)
    got = torch.empty(5, 7, dtype=dtype, device=DEVICE)
    torch.addbmm(da, *(t.to(DEVICE) for t in batches), beta=2, alpha=3, out=got)  # Scalars unboxed too
    torch.testing.assert_close(got.cpu(), torch.addbmm(a, *batches, beta=2, alpha=3), rtol=0, atol=0)
    if dtype.is_floating_point:
        torch.testing.assert_close(torch.logaddexp(da, db).cpu(), torch.logaddexp(a, b), rtol=0, atol=0)
        x = da.clone()
        assert x.lerp_(db, 0.25) is x
        torch.testing.assert_close(x.cpu(), a.lerp(b, 0.25), rtol=0, atol=0)
        torch.testing.assert_close(torch.sinh(da).cpu(), torch.sinh(a), rtol=0, atol=0)
        expected = {"aten::logaddexp": 1, "aten::lerp_.Scalar": 1, "aten::sinh": 1}
    else:
        expected = {}
    counts = max_device.fallback_counts()
    assert {op: counts[op] for op in expected} == expected
    assert counts["aten::minimum.out"] == 1 and counts["aten::addbmm.out"] == 1


def test_an_out_of_the_wrong_shape_is_resized_and_views_of_it_see_it(untouched):
    a, b = randn(4, 5, seed=1), randn(4, 5, seed=2)
    out = torch.empty(0, device=DEVICE)
    torch.minimum(a.to(DEVICE), b.to(DEVICE), out=out)
    assert out.shape == (4, 5)
    torch.testing.assert_close(out.cpu(), torch.minimum(a, b), rtol=0, atol=0)
    # a non-contiguous out keeps its strides, as on the CPU
    wide = torch.zeros(5, 4, device=DEVICE)
    torch.minimum(a.to(DEVICE), b.to(DEVICE), out=wide.t())
    torch.testing.assert_close(wide.t().cpu(), torch.minimum(a, b), rtol=0, atol=0)


def test_one_tensor_as_input_and_output(untouched):
    a, b = randn(16, seed=1), randn(16, seed=2)
    x = a.to(DEVICE)
    torch.minimum(x, b.to(DEVICE), out=x)
    torch.testing.assert_close(x.cpu(), torch.minimum(a, b), rtol=0, atol=0)
    torch.minimum(x, x, out=x)
    torch.testing.assert_close(x.cpu(), torch.minimum(a, b), rtol=0, atol=0)


def test_errors_name_the_op_and_leave_the_output_alone(untouched):
    da, out = randn(3, 3).to(DEVICE), torch.full((3, 3), 7.0, device=DEVICE)
    max_device.reset_fallback_counts()
    with pytest.raises(RuntimeError,
                       match=r"same device.*max_device:0 and cpu! \(argument 'other' of aten::minimum.out\)"):
        torch.minimum(da, randn(3, 3), out=out)
    with pytest.raises(RuntimeError, match=r"size of tensor a \(3\) must match the size of tensor b \(4\)"):
        torch.minimum(da, randn(4, 4).to(DEVICE), out=out)  # the CPU kernel's own error
    max_device.set_fallback_policy("error", op="aten::minimum")
    with pytest.raises(NotImplementedError, match=r"aten::minimum.out has no max_device kernel"):
        torch.minimum(da, da, out=out)
    assert out.cpu().eq(7.0).all()
    assert max_device.fallback_counts() == {"aten::minimum.out": 3}


@pytest.mark.skipif(torch.max_device.device_count() < 2, reason="needs two max_device devices")
def test_tensors_on_two_devices_are_refused(untouched):
    with pytest.raises(RuntimeError, match=r"max_device:0 and max_device:1! \(in aten::minimum.out\)"):
        torch.minimum(randn(2, 2).to("max_device:0"), randn(2, 2).to("max_device:1"),
                      out=torch.empty(2, 2, device="max_device:0"))


def test_outputs_land_on_the_inputs_device(untouched):
    device = f"{DEVICE}:{torch.max_device.device_count() - 1}"
    result = torch.sinh(randn(8).to(device))
    assert str(result.device) == device


def test_the_copying_fallback_serves_them_too(untouched):
    a, b = randn(4, 4, seed=1), randn(4, 4, seed=2)
    _C._set_fallback_impl("copying")
    out = torch.empty(4, 4, device=DEVICE)
    torch.minimum(a.to(DEVICE), b.to(DEVICE), out=out)
    torch.testing.assert_close(out.cpu(), torch.minimum(a, b), rtol=0, atol=0)
    torch.testing.assert_close(torch.sinh(a.to(DEVICE)).cpu(), torch.sinh(a), rtol=0, atol=0)
    counts = max_device.fallback_counts()
    assert counts["aten::minimum.out"] == 1 and counts["aten::sinh"] == 1


def test_the_profiler_names_the_fallback(untouched):
    da = randn(4, 4).to(DEVICE)
    with torch.profiler.profile() as prof:
        torch.minimum(da, da, out=torch.empty(4, 4, device=DEVICE))
    assert "max_device: aten::minimum.out <- cpu fallback" in {e.name for e in prof.events()}


def test_a_torch_library_kernel_replaces_it_without_a_warning():
    a = randn(8)
    seen = []

    def dot(self, other):
        seen.append(self.device.type)
        return torch.dot(self.cpu(), other.cpu()).to(self.device) + 100

    assert active_kernel("aten::dot") == "max_device unboxed CPU fallback"
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "Overriding a previously registered kernel" would raise
            lib.impl("dot", dot, "PrivateUse1")
        assert "aten::dot" not in _C._direct_fallback_ops()
        assert torch.dot(a.to(DEVICE), a.to(DEVICE)).item() == pytest.approx(torch.dot(a, a).item() + 100)
    finally:
        lib._destroy()
    assert seen == [DEVICE]
    # gone for good: the boxed fallback from now on, same result
    torch.testing.assert_close(torch.dot(a.to(DEVICE), a.to(DEVICE)).cpu(), torch.dot(a, a), rtol=0, atol=0)
    assert max_device.fallback_counts()["aten::dot"] == 1


def test_a_torch_library_kernel_for_an_out_op_ends_its_forms_too():
    """In a fresh process: the forms stay ended after the kernel leaves,
    which test_direct_fallback.py's census must not see."""
    result = run_python("""
import torch, max_device
from max_device import _C
a, b = torch.randn(3, 4), torch.randn(4)
seen = []

def logaddexp2_out(self, other, *, out):
    seen.append(tuple(out.shape))
    out.copy_(torch.logaddexp2(self.cpu(), other.cpu()))
    return out

lib = torch.library.Library("aten", "IMPL")
lib.impl("logaddexp2.out", logaddexp2_out, "PrivateUse1")
assert {"aten::logaddexp2", "aten::logaddexp2_", "aten::logaddexp2.out"} & set(_C._direct_fallback_ops()) == set()
result = torch.logaddexp2(a.to("max_device"), b.to("max_device"))  # PyTorch's composite, then the kernel
assert seen == [(3, 4)]
assert torch.equal(result.cpu(), torch.logaddexp2(a, b))
print("ok")
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_cpp_library_loaded_later_takes_over_its_ops_and_no_other(artifacts):
    """torch.ops.load_library of a TORCH_LIBRARY_IMPL for add.out (the
    benchmark's native kernel): no override warning, add.out and the add
    forms reach it, mm.out keeps its fallback kernel."""
    library = artifacts["native_add"]
    assert os.path.exists(library), f"{library}: built with the tests (make build)"
    result = run_python(f"""
import ctypes, warnings
import torch, max_device
from max_device import _C
warnings.simplefilter("error")
torch.ops.load_library({library!r})
calls = ctypes.CDLL({library!r}).bench_native_add_calls
direct = set(_C._direct_fallback_ops())
assert {{"aten::add.out", "aten::add.Tensor", "aten::add_.Tensor"}} & direct == set(), direct
assert {{"aten::mm.out", "aten::mm", "aten::relu"}} <= direct
a = torch.ones(4, device="max_device")
assert torch.add(a, a).cpu().eq(2).all() and calls() == 1
a.add_(a)
assert calls() == 2
assert torch.mm(a.view(2, 2), a.view(2, 2)).cpu().eq(8).all() and calls() == 2
print("ok")
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert "Overriding" not in result.stderr
