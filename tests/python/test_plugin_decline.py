"""Declined calls: what a plugin does not handle still gives the right
result (the provider below, here PyTorch's CPU kernel, runs), and the
decline is counted on the plugin's layer, on the op's fallbacks and in
max_device.fallback_counts()."""

import pytest
import torch

import max_device
from conftest import op_stats
from max_device.testing import to_device

DEVICE = "max_device"


def _assert_declined_once(kernel, fn, *cpu_inputs):
    """Run fn on the CPU inputs and on device copies; the device call must be
    declined by `kernel` exactly once, fall back once, and match the CPU."""
    dev_inputs = to_device(list(cpu_inputs))  # same strides and storage offsets
    expected = fn(*cpu_inputs)
    calls0, declines0, fallbacks0 = op_stats(kernel)
    counted0 = max_device.fallback_counts().get(kernel, 0)
    actual = fn(*dev_inputs)
    calls, declines, fallbacks = op_stats(kernel)
    assert (calls - calls0, declines - declines0, fallbacks - fallbacks0) == (0, 1, 1), \
        f"{kernel}: calls/declines/fallbacks changed by " \
        f"{(calls - calls0, declines - declines0, fallbacks - fallbacks0)}"
    assert max_device.fallback_counts().get(kernel, 0) - counted0 == 1
    assert actual.device.type == DEVICE
    torch.testing.assert_close(actual.cpu(), expected)
    for dev, cpu in zip(dev_inputs, cpu_inputs):  # in-place targets too
        torch.testing.assert_close(dev.cpu(), cpu)


@pytest.fixture
def reference(load_plugin, plugin_file):
    return load_plugin(plugin_file("reference"))


def _f64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


# The reference plugin is float32 only. Kernels with a float32 dtype mask are
# declined by the host without a call; the binary ops (mask 0, because of CPU
# scalars) are called and decline themselves. Both count as declines.
FLOAT64_CASES = [
    ("aten::add.out", lambda a, b: a + b, (_f64(3, 4), _f64(3, 4))),
    ("aten::add.out", lambda a, b: a.add_(b), (_f64(3, 4), _f64(4))),
    ("aten::mul.out", lambda a, b: torch.mul(a, b), (_f64(3, 4), _f64(3, 1))),
    ("aten::div.out", lambda a, b: a / b, (_f64(5), _f64(5))),
    ("aten::neg.out", lambda a: -a, (_f64(3, 4),)),
    ("aten::relu", torch.relu, (_f64(3, 4),)),
    ("aten::relu_", torch.relu_, (_f64(3, 4),)),
    ("aten::exp.out", torch.exp, (_f64(6),)),
    ("aten::sum.IntList_out", lambda a: a.sum(1), (_f64(3, 4),)),
    ("aten::mean.out", lambda a: a.mean(0, keepdim=True), (_f64(3, 4),)),
    ("aten::mm.out", torch.mm, (_f64(3, 4), _f64(4, 2))),
    ("aten::bmm.out", torch.bmm, (_f64(2, 3, 4), _f64(2, 4, 2))),
    ("aten::_softmax.out", lambda a: torch.softmax(a, -1), (_f64(3, 4),)),
    ("aten::_log_softmax.out", lambda a: torch.log_softmax(a, 0), (_f64(3, 4),)),
]


@pytest.mark.parametrize("kernel, fn, inputs", FLOAT64_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(FLOAT64_CASES)])
def test_float64_declined(reference, kernel, fn, inputs):
    _assert_declined_once(kernel, fn, *inputs)


def test_int64_declined(reference):
    a = torch.arange(12).reshape(3, 4)
    _assert_declined_once("aten::add.out", lambda x, y: x + y, a, a.flip(0))
    _assert_declined_once("aten::mul.out", lambda x, y: x * y, a, a)


def test_argument_values_declined(reference):
    """Float32 inputs, but an argument value the kernels do not implement."""
    x = torch.randn(3, 4)
    _assert_declined_once("aten::sum.IntList_out", lambda t: t.sum(0, dtype=torch.float64), x)
    _assert_declined_once("aten::mean.out", lambda t: t.mean(1, dtype=torch.float64), x)
    _assert_declined_once("aten::add.out", lambda t, u: torch.add(t, u, out=torch.empty_like(t, dtype=torch.float64)),
                          x, x)


def test_served_cases_are_not_declines(reference):
    """Counterpart: strided float32, broadcasting and CPU scalars are served."""
    x = torch.randn(4, 6)
    calls0, declines0, _ = op_stats("aten::add.out")
    for dev_result, cpu_result in [
        (x.to(DEVICE).t() + 2, x.t() + 2),
        (x.to(DEVICE)[:, ::2] + torch.tensor(1.5), x[:, ::2] + torch.tensor(1.5)),
        (x.to(DEVICE) + x.to(DEVICE)[0], x + x[0]),
    ]:
        torch.testing.assert_close(dev_result.cpu(), cpu_result)
    calls, declines, _ = op_stats("aten::add.out")
    assert (calls - calls0, declines - declines0) == (3, 0)


def test_non_contiguous_declined_by_kernel(load_plugin, fixture_file):
    """The `good` fixture's neg.out declines non-contiguous tensors itself."""
    load_plugin(fixture_file("good"))
    x = torch.randn(4, 6)
    _assert_declined_once("aten::neg.out", torch.neg, x.t())
    _assert_declined_once("aten::neg.out", lambda t: t[:, ::2].neg(), x)
    # contiguous: served
    calls0 = op_stats("aten::neg.out")[0]
    torch.testing.assert_close(torch.neg(x.to(DEVICE)).cpu(), -x)
    assert op_stats("aten::neg.out")[0] == calls0 + 1


def test_non_contiguous_declined_by_capability_flag(load_plugin, plugin_file):
    """sdk_example's silu.out declares CONTIGUOUS_ONLY: the host declines."""
    load_plugin(plugin_file("sdk_example"))
    x = torch.randn(5, 4)
    f = torch.nn.functional.silu
    _assert_declined_once("aten::silu.out", f, x.t())
    _assert_declined_once("aten::silu.out", f, x[::2])
    _assert_declined_once("aten::silu.out", f, x.double())
    calls0 = op_stats("aten::silu.out")[0]
    torch.testing.assert_close(f(x.to(DEVICE)).cpu(), f(x))
    assert op_stats("aten::silu.out")[0] == calls0 + 1


def test_decline_passes_to_plugin_below(load_plugin, plugin_file, fixture_file):
    """With `good` stacked on the reference plugin, good's decline
    (non-contiguous) goes to reference, not to the CPU: no fallback."""
    load_plugin(plugin_file("reference"))
    load_plugin(fixture_file("good"))
    x = torch.randn(4, 6)
    entry0 = _entry("aten::neg.out")
    assert [l["owner"] for l in entry0["layers"]] == ["reference@1.0.0", "good@1.0.0"]
    torch.testing.assert_close(torch.neg(x.to(DEVICE).t()).cpu(), -x.t())
    entry = _entry("aten::neg.out")
    ref, good = entry["layers"]
    assert (good["calls"], good["declines"]) == (0, 1)
    assert (ref["calls"], ref["declines"]) == (1, 0)
    assert entry["fallbacks"] == entry0["fallbacks"]
    assert "aten::neg.out" not in max_device.fallback_counts()


def _entry(op):
    return next(e for e in max_device.list_ops() if e["op"] == op)


def test_list_ops_fallbacks_agree_with_fallback_counts(load_plugin, fixture_file):
    load_plugin(fixture_file("good"))
    torch.neg(torch.randn(4, 6, device=DEVICE).t())  # declined by good -> CPU
    assert _entry("aten::neg.out")["fallbacks"] == max_device.fallback_counts()["aten::neg.out"] == 1
    max_device.reset_fallback_counts()
    assert max_device.fallback_counts().get("aten::neg.out", 0) == 0
    assert _entry("aten::neg.out")["fallbacks"] == 0
