"""The fast plugin (plugins/fast/): every instruction-set variant computes
what the CPU computes (gradients through layer norm and embedding, and
fused AdamW, included), the host's thread count does not change a result,
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
    # (GEMMs under 2^17 multiply-adds per matrix are left to the CPU)
    batch = (torch.randn(2, 50, 70, generator=g), torch.randn(2, 70, 45, generator=g))
    big = torch.randn(1 << 20, generator=g)  # streaming stores
    ln_w, ln_b = torch.randn(129, generator=g), torch.randn(129, generator=g)
    table = torch.randn(50, 129, generator=g)
    indices = torch.randint(0, 50, (7, 11), generator=g)  # with repeats: gradients add up
    x, b, col, a, m, big, ln_w, ln_b, table, indices = (
        t.to(device) for t in (x, b, col, a, m, big, ln_w, ln_b, table, indices))
    batch = tuple(t.to(device) for t in batch)
    xg = x.detach().clone().requires_grad_()
    loss = (torch.log_softmax(F.gelu(xg), -1) * torch.softmax(torch.relu(xg) * 2, -1)).sum()
    loss.backward()
    # layer norm and embedding with gradients for every input
    ln_in, wg, bg, tg = (t.detach().clone().requires_grad_() for t in (x, ln_w, ln_b, table))
    normed = F.layer_norm(ln_in, (129,), wg, bg)
    embedded = F.embedding(indices, tg)
    ((normed * normed.detach().sin()).sum() + (embedded * embedded.detach().cos()).sum()).backward()
    return {
        "layer_norm": normed, "layer_norm grad input": ln_in.grad, "layer_norm grad weight": wg.grad,
        "layer_norm grad bias": bg.grad, "embedding": embedded, "embedding grad": tg.grad,
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
    gemms = ("aten::mm.out", "aten::bmm.out", "aten::addmm.out")
    before = [op_stats(op)[0] for op in gemms]
    results = workload(DEVICE)
    assert all(op_stats(op)[0] > n for op, n in zip(gemms, before)), "the plugin's GEMM did not run"
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


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_bfloat16_broadcasts_and_special_values_match_the_cpu(fast, op):
    """Rows, columns and a 0-dim tensor broadcast over lengths with a vector
    tail; NaN, infinities, rounding ties and values past bfloat16's range."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(9, 37, generator=g) * 100).bfloat16()
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3.3895e38])
    x[1, :3] = torch.tensor([1.00390625, 1.01171875, -1.00390625]).bfloat16()  # ties, once added to 1/256
    f = getattr(torch, op)
    # No alpha: the CPU's bfloat16 kernel rounds alpha * b to bfloat16 in its
    # scalar tail (BFloat16 operators) but not in its vector body, so its
    # results depend on where its own loop's tail falls.
    kwargs = {}
    others = {"row": torch.randn(37, generator=g).bfloat16(), "column": torch.randn(9, 1, generator=g).bfloat16(),
              "0-dim": torch.tensor(1 / 256).bfloat16(), "same": x.flip(1)}
    calls = op_stats(f"aten::{op}.out")[0]
    for name, y in others.items():
        got = f(x.to(DEVICE), y.to(DEVICE), **kwargs).cpu()
        torch.testing.assert_close(got, f(x, y, **kwargs), rtol=0, atol=0, equal_nan=True, msg=name)
        got = f(y.to(DEVICE), x.to(DEVICE), **kwargs).cpu()
        torch.testing.assert_close(got, f(y, x, **kwargs), rtol=0, atol=0, equal_nan=True, msg=name)
    assert op_stats(f"aten::{op}.out")[0] == calls + 2 * len(others)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_bfloat16_with_a_python_number_rounds_it_as_the_cpu_does(fast, op):
    # The CPU rounds the number to bfloat16 for add and sub and for a number
    # first operand, and keeps it in float32 as mul's or div's second: 0.9189
    # (gaussian_nll_loss's constant) tells the two apart on these inputs.
    torch.manual_seed(0)
    x, c = (torch.randn(4096) * 3).bfloat16(), 0.9189385332046727
    f = getattr(torch, op)
    calls = op_stats(f"aten::{op}.out")[0]
    d = x.to(DEVICE)
    assert torch.equal(f(d, c).cpu(), f(x, c)) and torch.equal(f(c, d).cpu(), f(c, x))
    assert op_stats(f"aten::{op}.out")[0] == calls + 2


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("cols", [19, 1000], ids=["short rows", "streamed rows"])
def test_softmax_of_extreme_rows_matches_the_cpu(fast, name, cols):
    # Rows with a NaN, +inf, all -inf, some -inf, a spread past exp's range
    # (underflow to 0) and large magnitudes (log_softmax's cancellation),
    # over a vector body and a tail; 1100 x 1000 crosses the 4 MiB at which
    # outputs are streamed past the cache.
    g = torch.Generator().manual_seed(5)
    rows = 1100 if cols == 1000 else 8
    x = torch.randn(rows, cols, generator=g) * 40
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2] = float("-inf")
    x[3, ::2] = float("-inf")
    x[4, 0] = 1e30
    x[5] += 1e4
    op, kernel = getattr(torch, name), f"aten::_{name}.out"
    calls = op_stats(kernel)[0]
    got = op(x.to(DEVICE), -1).cpu()
    assert op_stats(kernel)[0] == calls + 1
    expected = op(x, -1)
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-6, equal_nan=True)


# (M, K, N): past one block each way (row blocks of <= 192, column blocks of
# <= 512, K slices of 256); one block of rows, which more threads split by
# columns; three blocks of rows and one of columns, which two threads split
# into four by rows. Every one has edge tiles.
GEMM_SHAPES = {"many blocks": (403, 701, 1100), "few rows": (64, 300, 200), "few columns": (500, 260, 250)}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", GEMM_SHAPES)
@pytest.mark.parametrize("case", ["mm", "mm transposed", "addmm", "bmm"])
def test_gemm_over_many_blocks_is_within_float32s_error_bound(load_plugin, plugin_file, monkeypatch, isa, threads,
                                                              shape, case):
    # Checked against float64 with the bound on a K-term float32 dot
    # product: K * eps * (|A| @ |B|). Each instruction set's tile runs in its
    # own passes of rows (12, 3, 1).
    if not cpu_has(*ISAS[isa]):
        pytest.skip(f"this CPU has no {isa}")
    monkeypatch.setenv("MAX_DEVICE_FAST_ISA", isa)
    load_plugin(plugin_file("fast"))
    g = torch.Generator().manual_seed(4)
    M, K, N = GEMM_SHAPES[shape]
    batch = 3 if case == "bmm" else 1
    a = torch.randn(batch, M, K, generator=g)
    b = torch.randn(batch, K, N, generator=g)
    c = torch.randn(M, N, generator=g)
    if case == "mm transposed":  # column-major operands take the other packing path
        a, b = a.transpose(1, 2).contiguous().transpose(1, 2), b.transpose(1, 2).contiguous().transpose(1, 2)
    run = {
        "mm": lambda a, b, c: a[0] @ b[0],
        "mm transposed": lambda a, b, c: a[0] @ b[0],
        "addmm": lambda a, b, c: torch.addmm(c, a[0], b[0], beta=0.5, alpha=2),
        "bmm": lambda a, b, c: torch.bmm(a, b),
    }[case]
    op = {"mm transposed": "aten::mm.out", "bmm": "aten::bmm.out", "addmm": "aten::addmm.out"}.get(case, "aten::mm.out")
    before_threads = torch.get_num_threads()
    on_device = [t.to(DEVICE) for t in (a, b, c)]
    try:
        calls = op_stats(op)[0]
        torch.set_num_threads(threads)
        got = run(*on_device).cpu().double()
        torch.set_num_threads(1)
        one_thread = run(*on_device).cpu().double()
    finally:
        torch.set_num_threads(before_threads)
    assert op_stats(op)[0] == calls + 2, "the plugin's GEMM did not run"
    # The blocks change with the thread count, each element's sum does not.
    assert torch.equal(got, one_thread)
    exact = run(a.double(), b.double(), c.double())
    scale = 2 if case == "addmm" else 1
    bound = (K + 2) * torch.finfo(torch.float32).eps * (scale * run(a.double().abs(), b.double().abs(), c.double().abs()))
    excess = (got - exact).abs() - bound
    assert excess.max() <= 0, f"{case}: {int((excess > 0).sum())} elements past the bound"


@pytest.mark.parametrize("case", ["non-contiguous", "float64", "bfloat16 GEMM", "small GEMM", "softmax dim 0"])
def test_what_it_does_not_serve_falls_to_the_cpu(fast, case):
    x = torch.randn(32, 48)
    op, run = {
        "non-contiguous": ("aten::add.out", lambda t: t.t() + 1),
        "float64": ("aten::add.out", lambda t: t.double() + 1),
        "bfloat16 GEMM": ("aten::mm.out", lambda t: t.bfloat16() @ t.bfloat16().t()),
        "small GEMM": ("aten::mm.out", lambda t: t @ t.t()),  # 32x32x48 multiply-adds
        "softmax dim 0": ("aten::_softmax.out", lambda t: torch.softmax(t, 0)),
    }[case]
    expected = run(x)
    d = x.to(DEVICE)
    _, declines, fallbacks = op_stats(op)
    torch.testing.assert_close(run(d).cpu(), expected)
    _, declines_after, fallbacks_after = op_stats(op)
    assert declines_after == declines + 1 and fallbacks_after == fallbacks + 1


LAYER_NORM_AND_EMBEDDING_OPS = ("aten::native_layer_norm", "aten::native_layer_norm_backward",
                                "aten::embedding", "aten::embedding_dense_backward")


def test_layer_norm_and_embedding_reach_the_plugin_with_their_backwards(fast):
    before = {op: op_stats(op) for op in LAYER_NORM_AND_EMBEDDING_OPS}
    workload(DEVICE)
    for op in LAYER_NORM_AND_EMBEDDING_OPS:
        calls, declines, fallbacks = op_stats(op)
        assert calls == before[op][0] + 1, f"{op} did not reach the plugin"
        assert (declines, fallbacks) == before[op][1:], f"{op} declined or fell back"


def layer_norm_with_grads(x, w, b):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = F.layer_norm(x, x.shape[-1:], w, b)
    # an explicit gradient: no reduction of other ops in the way (a CPU sum's
    # last bits can depend on the data's alignment, which differs by allocator)
    y.backward(y.detach().cos())
    return [y, x.grad, w.grad, b.grad]


def test_without_the_plugin_layer_norm_is_the_cpus_kernel_bit_for_bit(load_plugin, plugin_file):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(33, 257, generator=g), torch.randn(257, generator=g), torch.randn(257, generator=g)
    expected = layer_norm_with_grads(x, w, b)
    on_device = lambda: [t.cpu() for t in layer_norm_with_grads(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE))]
    for got, want in zip(on_device(), expected):  # before any plugin: the CPU's kernel
        assert torch.equal(got, want)
    plugin = load_plugin(plugin_file("fast"))
    for got, want in zip(on_device(), expected):  # the plugin's kernels: same values, another order
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert op_stats("aten::native_layer_norm")[0] == 1
    max_device.unload_plugin(plugin)
    fallbacks = max_device.fallback_counts().get("aten::native_layer_norm", 0)
    for got, want in zip(on_device(), expected):  # unloaded: the CPU's kernel again
        assert torch.equal(got, want)
    assert max_device.fallback_counts()["aten::native_layer_norm"] == fallbacks + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_adamw_steps_like_the_cpu(fast, dtype):
    g = torch.Generator().manual_seed(2)
    shapes = [(64, 33), (33,), (1000,), (5, 7, 9)]
    start = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    grads = [[torch.randn(s, generator=g).to(dtype) for s in shapes] for _ in range(3)]

    def run(device):
        params = [torch.nn.Parameter(p.clone().to(device)) for p in start]
        opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, fused=True)
        for step_grads in grads:
            for p, gr in zip(params, step_grads):
                p.grad = gr.to(device)
            opt.step()
        return [p.detach().cpu() for p in params], [opt.state[p]["exp_avg_sq"].cpu() for p in params]

    calls = op_stats("aten::_fused_adamw_")[0]
    got, expected = run(DEVICE), run("cpu")
    assert op_stats("aten::_fused_adamw_")[0] == calls + 3
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for g_list, e_list in zip(got, expected):
        for a, e in zip(g_list, e_list):
            torch.testing.assert_close(a, e, **tol)


@pytest.mark.parametrize("case", ["layer norm without bias", "embedding scale_grad_by_freq", "amsgrad"])
def test_what_it_declines_of_the_new_ops_falls_to_the_cpu(fast, case):
    g = torch.Generator().manual_seed(3)
    if case == "layer norm without bias":  # grad_bias is not asked for: the mask is not all true
        x, w = torch.randn(8, 16, generator=g), torch.randn(16, generator=g)
        op = "aten::native_layer_norm_backward"

        def run(device):
            xd, wd = (t.to(device).clone().requires_grad_() for t in (x, w))
            F.layer_norm(xd, (16,), wd, None).sum().backward()
            return [xd.grad.cpu(), wd.grad.cpu()]
    elif case == "embedding scale_grad_by_freq":
        table, idx = torch.randn(10, 4, generator=g), torch.tensor([1, 1, 3])
        op = "aten::embedding_dense_backward"

        def run(device):
            t = table.to(device).clone().requires_grad_()
            F.embedding(idx.to(device), t, scale_grad_by_freq=True).sum().backward()
            return [t.grad.cpu()]
    else:
        p0, grad = torch.randn(20, generator=g), torch.randn(20, generator=g)
        op = "aten::_fused_adamw_"

        def run(device):
            p = torch.nn.Parameter(p0.clone().to(device))
            p.grad = grad.to(device)
            torch.optim.AdamW([p], lr=0.01, amsgrad=True, fused=True).step()
            return [p.detach().cpu()]
    expected = run("cpu")
    _, declines, fallbacks = op_stats(op)
    for got, want in zip(run(DEVICE), expected):
        torch.testing.assert_close(got, want)
    _, declines_after, fallbacks_after = op_stats(op)
    assert declines_after == declines + 1 and fallbacks_after == fallbacks + 1


def test_the_plugin_passes_check(plugin_file):
    # `python -m max_device check` with 3 OpInfo samples per case (8 by
    # default: the same verdict, 3x the time)
    result = check_plugin(plugin_file("fast"), max_samples=3, quiet=True)
    assert result.passed, result.table()
