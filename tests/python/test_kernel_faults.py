"""Kernels that break the contract at call time: each call ends in a
max_device.KernelError naming the plugin, the op and the file; the process
lives, the plugin stays loaded and serving (and failing) until unloaded.
Breaches the host cannot see cheaply are found with kernel checks
(MAX_DEVICE_CHECK_KERNELS=1). A plugin whose library cannot leave the
process is reported by unload."""

import json

import pytest
import torch

import max_device
from conftest import op_stats, run_python

DEVICE = "max_device"


def _neg_out(x):
    return torch.neg(x, out=torch.empty_like(x))


# fixture -> (the call that reaches its kernel, op, what the message says)
FAULTS = {
    "failing_kernel": (_neg_out, "aten::neg.out", "fixture kernel failed on purpose"),
    "unset_output": (torch.frac, "aten::frac", "returned success without allocating output 0"),
    # a CPU tensor the kernel put into call->outputs itself: the host only
    # returns outputs it allocated
    "foreign_output": (torch.frac, "aten::frac", "returned success without allocating output 0"),
    "sdk_throws": (_neg_out, "aten::neg.out", "fixture kernel threw std::runtime_error"),
    "c_abi_throws": (_neg_out, "aten::neg.out",
                     "threw a C++ exception across the C ABI (wrap C++ kernels in MAXDEV_SDK_KERNEL): "
                     "fixture kernel threw across the C ABI"),
}


@pytest.mark.parametrize("fixture", list(FAULTS))
def test_kernel_fault_raises_kernel_error(fixture, load_plugin, fixture_file):
    call, op, message = FAULTS[fixture]
    path = fixture_file(fixture)
    load_plugin(path)
    plugins = [(p.name, p.sha256, p.generation) for p in max_device.list_plugins()]
    x = torch.randn(4, device=DEVICE)

    with pytest.raises(max_device.KernelError) as info:
        call(x)
    e = info.value
    assert type(e) is max_device.KernelError and isinstance(e, RuntimeError)
    assert (e.plugin, e.op, e.file) == (fixture, op, path)
    assert str(e) == f"plugin '{fixture}', op {op} ({path}): {message}"
    # an error is not a decline: the call counts, nothing fell back
    assert op_stats(op)[:2] == (1, 0)
    assert op not in max_device.fallback_counts()
    assert [(p.name, p.sha256, p.generation) for p in max_device.list_plugins()] == plugins
    with pytest.raises(max_device.KernelError):
        call(x)

    max_device.unload_plugin(fixture)
    torch.testing.assert_close(call(x).cpu(), call(x.cpu()))


CHECKED_CALLS = """
import json, sys, torch, max_device
results = {}
for fixture, path in zip(sys.argv[1::2], sys.argv[2::2]):
    plugin = max_device.load_plugin(path)
    x = torch.arange(1.0, 5.0, device="max_device")
    try:
        if fixture in ("wrong_shape", "wrong_dtype"):
            torch.frac(x)
        else:
            torch.neg(x, out=torch.empty(4, device="max_device"))
            torch.neg(x, out=x)  # the input is the output: writing it is the point
        results[fixture] = None
    except max_device.KernelError as e:
        results[fixture] = [str(e), e.plugin, e.op, e.file, x.cpu().tolist()]
    plugin.unload()
print(json.dumps(results))
"""


def test_kernel_checks_find_what_the_boundary_cannot(fixture_file):
    """With MAX_DEVICE_CHECK_KERNELS=1, outputs are compared with the op's
    meta kernel and read-only inputs are hashed around the call; a correct
    plugin passes, including an out= that aliases its input."""
    fixtures = ["wrong_shape", "wrong_dtype", "writes_input", "good"]
    args = [a for f in fixtures for a in (f, fixture_file(f))]
    result = run_python(CHECKED_CALLS, env={"MAX_DEVICE_CHECK_KERNELS": "1"}, args=args)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert results.pop("good") is None

    def where(fixture, op):
        return f"plugin '{fixture}', op {op} ({fixture_file(fixture)}): "

    expected = {
        "wrong_shape": ("aten::frac", "returned output 0 as Float[5] where the op's meta kernel gives Float[4]"),
        "wrong_dtype": ("aten::frac", "returned output 0 as Double[4] where the op's meta kernel gives Float[4]"),
        "writes_input": ("aten::neg.out", "wrote into argument 0 (self), which its schema marks read-only"),
    }
    for fixture, (op, message) in expected.items():
        text, plugin, e_op, file, x = results[fixture]
        assert text == where(fixture, op) + message + " (found by kernel checks)"
        assert (plugin, e_op, file) == (fixture, op, fixture_file(fixture))
    assert results["writes_input"][4] == [42.0, 2.0, 3.0, 4.0]  # detected after the fact, not prevented


def test_kernel_checks_switch_at_runtime(load_plugin, fixture_file):
    """set_kernel_checks turns the checks on and off in a running process."""
    load_plugin(fixture_file("wrong_shape"))
    x = torch.arange(1.0, 5.0, device=DEVICE)
    assert not max_device.kernel_checks()
    assert torch.frac(x).shape == (5,)  # unchecked: the breach goes unseen
    max_device.set_kernel_checks(True)
    try:
        assert max_device.kernel_checks()
        with pytest.raises(max_device.KernelError, match="meta kernel gives Float\\[4\\]"):
            torch.frac(x)
    finally:
        max_device.set_kernel_checks(False)
    assert torch.frac(x).shape == (5,)


UNLOAD_CODE = """
import json, sys, torch, max_device
plugin = max_device.load_plugin(sys.argv[1])
if sys.argv[2] == "call":
    torch.neg(torch.ones(4, device="max_device"), out=torch.empty(4, device="max_device"))
print(json.dumps(plugin.unload()))
"""


@pytest.mark.parametrize("fixture, call, unmapped", [("thread_local_pins", False, True),
                                                     ("thread_local_pins", True, False),
                                                     ("rule_breaking/gnu_unique_pins", False, False)])
def test_unload_reports_a_library_it_cannot_unmap(fixture, call, unmapped, fixture_file):
    """The kernel of thread_local_pins constructs a thread_local with a
    destructor on the calling thread: from then on glibc keeps the library
    mapped until that thread exits. gnu_unique_pins exports a GNU unique
    symbol, which pins it from the moment it is opened. unload says so,
    and logs why."""
    result = run_python(UNLOAD_CODE, args=(fixture_file(fixture), "call" if call else "load"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"name": fixture.split("/")[-1], "unmapped": unmapped}
    logged = "its library is still mapped" in result.stderr and "GNU unique symbols" in result.stderr
    assert logged == (not unmapped)
