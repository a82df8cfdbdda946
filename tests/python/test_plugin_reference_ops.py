"""The reference plugin against PyTorch's OpInfo samples.

For every op the reference plugin serves that has an OpInfo entry, all
float32 samples run on max_device with the plugin loaded and are compared
with the CPU at assert_close's float32 defaults. The call counters of
max_device.list_ops() prove the plugin kernel ran (for at least one sample
of each op); a sample the plugin declines must show up as a decline and as a
CPU fallback of the same op. In-place and out= variants are checked the same
way.
"""

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import max_device
from conftest import op_stats
from max_device.testing import to_cpu, to_device

DEVICE = "max_device"

# (OpInfo name, variant) -> the plugin kernels that serve it. Counters are
# summed over the kernels. SERVED: the plugin must run for >= 1 sample;
# DECLINED: every sample that reaches the plugin is declined by design.
SERVED, DECLINED = "served", "declined"
OPINFO_KERNELS = {
    ("add", ""): (["aten::add.out"], SERVED),
    ("sub", ""): (["aten::sub.out"], SERVED),
    ("mul", ""): (["aten::mul.out"], SERVED),
    ("div", "no_rounding_mode"): (["aten::div.out"], SERVED),
    ("neg", ""): (["aten::neg.out"], SERVED),
    ("nn.functional.relu", ""): (["aten::relu", "aten::relu_", "aten::relu.out"], SERVED),
    ("nn.functional.gelu", ""): (["aten::gelu.out"], SERVED),
    ("exp", ""): (["aten::exp.out"], SERVED),
    ("tanh", ""): (["aten::tanh.out"], SERVED),
    ("sigmoid", ""): (["aten::sigmoid.out"], SERVED),
    ("sum", ""): (["aten::sum.IntList_out"], SERVED),
    ("mean", ""): (["aten::mean.out"], SERVED),
    ("mm", ""): (["aten::mm.out"], SERVED),
    ("addmm", ""): (["aten::addmm.out"], SERVED),
    ("addmm", "decomposed"): (["aten::addmm.out"], SERVED),
    ("bmm", ""): (["aten::bmm.out"], SERVED),
    ("bmm", "triton_optimized"): (["aten::bmm.out"], SERVED),
    ("softmax", ""): (["aten::_softmax.out"], SERVED),
    # softmax(x, dtype=float64) converts x first: the kernel sees float64.
    ("softmax", "with_dtype"): (["aten::_softmax.out"], DECLINED),
    ("log_softmax", ""): (["aten::_log_softmax.out"], SERVED),
    ("log_softmax", "with_dtype"): (["aten::_log_softmax.out"], DECLINED),
    ("_softmax_backward_data", ""): (["aten::_softmax_backward_data.out"], SERVED),
}

# Kernels of the plugin with no OpInfo of their own: covered by the in-place,
# out= and autograd checks below.
WITHOUT_OPINFO = {"aten::_log_softmax_backward_data.out", "reference::version"}


# OpInfo variants newer than the oldest supported torch: (major, minor) of
# the first torch whose op_db has them.
OPINFO_ADDED_IN = {("bmm", "triton_optimized"): (2, 13)}
TORCH_MINOR = tuple(int(n) for n in torch.__version__.split(".")[:2])


def _opinfos():
    by_key = {(op.name, op.variant_test_name): op for op in op_db}
    expected = [key for key in OPINFO_KERNELS if TORCH_MINOR >= OPINFO_ADDED_IN.get(key, (0, 0))]
    missing = sorted(set(expected) - set(by_key))
    assert not missing, f"OpInfo entries not in this torch's op_db: {missing}"
    return [pytest.param(by_key[key], *OPINFO_KERNELS[key],
                         id=key[0] + (f".{key[1]}" if key[1] else "")) for key in expected]


@pytest.fixture
def reference(load_plugin, plugin_file):
    """The reference plugin, loaded fresh (zeroed counters) for one test."""
    return load_plugin(plugin_file("reference"))


def _stats(kernels):
    calls = declines = fallbacks = 0
    for k in kernels:
        c, d, f = op_stats(k)
        calls, declines, fallbacks = calls + c, declines + d, fallbacks + f
    return calls, declines, fallbacks


def _fallback_count(kernels):
    counts = max_device.fallback_counts()
    return sum(counts.get(k, 0) for k in kernels)


def test_every_served_op_is_covered(reference):
    covered = {k for kernels, _ in OPINFO_KERNELS.values() for k in kernels} | WITHOUT_OPINFO
    covered |= {k for _, k, _ in VARIANTS}
    assert sorted(set(reference.ops) - covered) == []
    assert sorted(covered - set(reference.ops)) == []


@pytest.mark.parametrize("op, kernels, expectation", _opinfos())
def test_opinfo_float32_samples(reference, op, kernels, expectation):
    served, declined = [], []
    for i, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=False)):
        dev_input, dev_args, dev_kwargs = to_device((sample.input, sample.args, sample.kwargs))
        calls0, declines0, fallbacks0 = _stats(kernels)
        counted0 = _fallback_count(kernels)

        expected = op(sample.input, *sample.args, **sample.kwargs)
        actual = op(dev_input, *dev_args, **dev_kwargs)
        summary = sample.summary() if hasattr(sample, "summary") else repr(sample)
        torch.testing.assert_close(to_cpu(actual), expected, equal_nan=True,
                                   msg=lambda m: f"{op.name} sample {i} ({summary}): {m}")

        calls, declines, fallbacks = (a - b for a, b in zip(_stats(kernels), (calls0, declines0, fallbacks0)))
        if calls:
            served.append(i)
        if declines:
            declined.append((i, summary))
            # The plugin is the only layer: a decline lands on the CPU fallback.
            assert fallbacks == declines, f"sample {i}: {declines} declines, {fallbacks} fallbacks"
            assert _fallback_count(kernels) - counted0 == declines, f"sample {i}: fallback_counts()"

    print(f"\n{op.name}{'.' + op.variant_test_name if op.variant_test_name else ''}: "
          f"served samples {served}; declined {[i for i, _ in declined]}")
    for i, summary in declined:
        print(f"  declined sample {i}: {summary}")
    if expectation == SERVED:
        assert served, f"the reference kernel {kernels} ran for none of the samples"
    else:
        assert not served and declined, f"expected every sample declined; served {served}"


# --- in-place, out= and backward variants -----------------------------------

def _inputs(device):
    g = torch.Generator().manual_seed(0)
    t = {
        "a": torch.randn(4, 5, generator=g),
        "b": torch.randn(4, 5, generator=g),
        "row": torch.randn(5, generator=g),
        "m": torch.randn(5, 3, generator=g),
        "bias": torch.randn(4, 3, generator=g),
        "o": torch.zeros(4, 5),
        "o_mm": torch.zeros(4, 3),
        "o_red": torch.zeros(5),
    }
    return {k: v.to(device) for k, v in t.items()}


# (id, kernel that must run, fn(tensors) -> result)
VARIANTS = [
    ("add_", "aten::add.out", lambda t: t["a"].add_(t["b"], alpha=2)),
    ("add_ broadcast", "aten::add.out", lambda t: t["a"].add_(t["row"])),
    ("add_ scalar", "aten::add.out", lambda t: t["a"].add_(3)),
    ("add out=", "aten::add.out", lambda t: torch.add(t["a"], t["b"], alpha=-0.5, out=t["o"])),
    ("sub_", "aten::sub.out", lambda t: t["a"].sub_(t["b"])),
    ("sub out=", "aten::sub.out", lambda t: torch.sub(t["a"], t["b"], out=t["o"])),
    ("mul_", "aten::mul.out", lambda t: t["a"].mul_(t["b"])),
    ("mul out=", "aten::mul.out", lambda t: torch.mul(t["a"], 2.5, out=t["o"])),
    ("div_", "aten::div.out", lambda t: t["a"].div_(t["b"])),
    ("div out=", "aten::div.out", lambda t: torch.div(t["a"], t["b"], out=t["o"])),
    ("neg_", "aten::neg.out", lambda t: t["a"].neg_()),
    ("neg out=", "aten::neg.out", lambda t: torch.neg(t["a"], out=t["o"])),
    ("relu_", "aten::relu_", lambda t: t["a"].relu_()),
    ("relu out=", "aten::relu.out", lambda t: torch.ops.aten.relu.out(t["a"], out=t["o"])),
    ("exp_", "aten::exp.out", lambda t: t["a"].exp_()),
    ("tanh_", "aten::tanh.out", lambda t: t["a"].tanh_()),
    ("sigmoid_", "aten::sigmoid.out", lambda t: t["a"].sigmoid_()),
    ("sigmoid out=", "aten::sigmoid.out", lambda t: torch.sigmoid(t["a"], out=t["o"])),
    ("gelu tanh", "aten::gelu.out", lambda t: torch.nn.functional.gelu(t["a"], approximate="tanh")),
    ("sum out=", "aten::sum.IntList_out", lambda t: torch.sum(t["a"], 0, out=t["o_red"])),
    ("mean out=", "aten::mean.out", lambda t: torch.mean(t["a"], 0, out=t["o_red"])),
    ("mm out=", "aten::mm.out", lambda t: torch.mm(t["a"], t["m"], out=t["o_mm"])),
    ("addmm_", "aten::addmm.out", lambda t: t["bias"].addmm_(t["a"], t["m"], beta=0.5, alpha=2)),
    ("addmm out=", "aten::addmm.out", lambda t: torch.addmm(t["bias"], t["a"], t["m"], out=t["o_mm"])),
    ("bmm out=", "aten::bmm.out",
     lambda t: torch.bmm(t["a"][None], t["m"][None], out=t["o_mm"][None])),
    ("softmax backward", "aten::_softmax_backward_data.out",
     lambda t: torch.ops.aten._softmax_backward_data(t["b"], torch.softmax(t["a"], 1), 1, torch.float32)),
    ("log_softmax backward", "aten::_log_softmax_backward_data.out",
     lambda t: torch.ops.aten._log_softmax_backward_data(t["b"], torch.log_softmax(t["a"], 1), 1,
                                                         torch.float32)),
]


@pytest.mark.parametrize("name, kernel, fn", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_inplace_and_out_variants(reference, name, kernel, fn):
    cpu, dev = _inputs("cpu"), _inputs(DEVICE)
    expected = fn(cpu)
    calls0, declines0, _ = op_stats(kernel)
    actual = fn(dev)
    calls, declines, _ = op_stats(kernel)
    assert (calls - calls0, declines - declines0) == (1, 0), f"{kernel} did not serve {name}"
    torch.testing.assert_close(actual.cpu(), expected)
    # Every input and output ends as on the CPU (in-place and out= targets).
    for key in cpu:
        torch.testing.assert_close(dev[key].cpu(), cpu[key], msg=lambda m: f"{key}: {m}")


def test_autograd_through_plugin_softmax(reference):
    x_cpu = torch.randn(3, 7, requires_grad=True)
    x_dev = x_cpu.detach().to(DEVICE).requires_grad_()
    for x in (x_cpu, x_dev):
        (torch.softmax(x, -1) * torch.arange(7.0, device=x.device)).sum().backward()
    assert op_stats("aten::_softmax.out")[0] == 1
    assert op_stats("aten::_softmax_backward_data.out")[0] == 1
    torch.testing.assert_close(x_dev.grad.cpu(), x_cpu.grad)


def test_custom_version_op(reference):
    x = torch.randn(2, 3, device=DEVICE)
    y = torch.ops.reference.version(x)
    assert y.device.type == DEVICE and y.dtype == torch.float32
    assert torch.equal(y.cpu(), torch.ones(2, 3))
    assert op_stats("reference::version")[0] == 1
