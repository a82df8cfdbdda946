"""The fast plugin (plugins/fast/): every instruction-set variant computes
what the CPU computes, the host's thread count does not change a result,
in-place and out= variants reach its .out kernels, and what it does not
serve falls to the CPU. (OpInfo's samples run on it in test_opinfo.py's
Fast configuration; its throughput is bench/bench_fast.py's, never a test's.)"""

import pytest
import torch
import torch.nn.functional as F

import max_device
from conftest import op_stats
from max_device.testing import check_plugin

DEVICE = "max_device"


def cpu_has(*flags):
    with open("/proc/cpuinfo") as f:
        have = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return all(flag in have for flag in flags)


ISAS = {"avx512": ("avx512f", "avx512bw", "avx512dq", "avx512vl"), "avx2": ("avx2", "fma"),
        "baseline": ()}


@pytest.fixture
def fast(load_plugin, plugin_file):
    return load_plugin(plugin_file("fast"))


def workload(device):
    """Each op the plugin serves, on shapes that exercise vector bodies,
    tails, broadcasting and GEMM edge tiles; gradients too."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 129, generator=g)
    b = torch.randn(129, generator=g)
    col = torch.randn(37, 1, generator=g)
    a, m = torch.randn(45, 67, generator=g), torch.randn(67, 51, generator=g)
    batch = (torch.randn(3, 13, 40, generator=g), torch.randn(3, 40, 35, generator=g))
    big = torch.randn(1 << 20, generator=g)  # streaming stores
    x, b, col, a, m, big = (t.to(device) for t in (x, b, col, a, m, big))
    batch = tuple(t.to(device) for t in batch)
    xg = x.detach().clone().requires_grad_()
    loss = (torch.log_softmax(F.gelu(xg), -1) * torch.softmax(torch.relu(xg) * 2, -1)).sum()
    loss.backward()
    return {
        "add": x + b, "sub alpha": torch.sub(x, col, alpha=0.5), "mul": x * col, "div": x / 3,
        "add big": big + big, "relu": torch.relu(x), "gelu": F.gelu(x),
        "gelu tanh": F.gelu(x, approximate="tanh"), "sum rows": x.sum(-1), "sum cols": x.sum(0),
        "mean": x.mean(), "softmax": torch.softmax(x, -1), "log_softmax": torch.log_softmax(x, -1),
        "mm": a @ m, "mm transposed": m.t() @ a.t(), "addmm": torch.addmm(b[:51], a, m, beta=0.5, alpha=2),
        "bmm": torch.bmm(*batch), "grad": xg.grad,
    }


def assert_matches_cpu(results, expected):
    for name, value in results.items():
        torch.testing.assert_close(value.cpu(), expected[name], atol=2e-5, rtol=2e-5, msg=name)


@pytest.mark.parametrize("isa", ISAS)
def test_each_instruction_set_computes_what_the_cpu_computes(load_plugin, plugin_file, monkeypatch, isa):
    if not cpu_has(*ISAS[isa]):
        pytest.skip(f"this CPU has no {isa}")
    monkeypatch.setenv("MAX_DEVICE_FAST_ISA", isa)
    load_plugin(plugin_file("fast"))
    before = op_stats("aten::mm.out")[0]
    results = workload(DEVICE)
    assert op_stats("aten::mm.out")[0] > before, "the plugin's GEMM did not run"
    assert_matches_cpu(results, workload("cpu"))


def test_an_unknown_instruction_set_is_refused_naming_the_variable(plugin_file, monkeypatch):
    monkeypatch.setenv("MAX_DEVICE_FAST_ISA", "sse9")
    with pytest.raises(max_device.PluginError, match="MAX_DEVICE_FAST_ISA=sse9"):
        max_device.load_plugin(plugin_file("fast"))
    assert all(p.name != "fast" for p in max_device.list_plugins())


def test_results_do_not_depend_on_the_thread_count(fast):
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append({k: v.cpu() for k, v in workload(DEVICE).items()})
    finally:
        torch.set_num_threads(before)
    for name in runs[0]:
        assert torch.equal(runs[0][name], runs[1][name]), name


def test_in_place_and_out_variants_reach_the_out_kernel(fast):
    x, y = torch.randn(64, 64), torch.randn(64)
    d = x.to(DEVICE)
    calls = op_stats("aten::add.out")[0]
    d.add_(y.to(DEVICE))
    out = torch.empty(0, device=DEVICE)  # resized through the host, as PyTorch's kernels do
    torch.add(d, y.to(DEVICE), out=out)
    assert op_stats("aten::add.out")[0] == calls + 2
    assert torch.equal(d.cpu(), x + y) and torch.equal(out.cpu(), x + y + y)
    assert out.shape == (64, 64)


def test_bfloat16_is_served_and_rounded_once(fast):
    x, y = torch.randn(1000).bfloat16(), torch.randn(1000).bfloat16()
    calls = op_stats("aten::mul.out")[0]
    got = (x.to(DEVICE) * y.to(DEVICE)).cpu()
    assert op_stats("aten::mul.out")[0] == calls + 1
    assert torch.equal(got, x * y)  # float32 product, one rounding: what the CPU gives


@pytest.mark.parametrize("case", ["non-contiguous", "float64", "bfloat16 GEMM", "softmax dim 0"])
def test_what_it_does_not_serve_falls_to_the_cpu(fast, case):
    x = torch.randn(32, 48)
    op, run = {
        "non-contiguous": ("aten::add.out", lambda t: t.t() + 1),
        "float64": ("aten::add.out", lambda t: t.double() + 1),
        "bfloat16 GEMM": ("aten::mm.out", lambda t: t.bfloat16() @ t.bfloat16().t()),
        "softmax dim 0": ("aten::_softmax.out", lambda t: torch.softmax(t, 0)),
    }[case]
    expected = run(x)
    d = x.to(DEVICE)
    _, declines, fallbacks = op_stats(op)
    torch.testing.assert_close(run(d).cpu(), expected)
    _, declines_after, fallbacks_after = op_stats(op)
    assert declines_after == declines + 1 and fallbacks_after == fallbacks + 1


def test_the_plugin_passes_check(plugin_file):
    # `python -m max_device check` with 3 OpInfo samples per case (8 by
    # default: the same verdict, 3x the time)
    result = check_plugin(plugin_file("fast"), max_samples=3, quiet=True)
    assert result.passed, result.table()
