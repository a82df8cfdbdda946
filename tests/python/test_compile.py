"""torch.compile on max_device: dynamo traces max_device tensors, Inductor
generates its CPU C++ kernels for them, and ops it does not lower are called
through the dispatcher, so plugins still serve them (even after a swap).

Tolerances. aot_eager runs the same aten ops as eager: results match to
float32 rounding (1e-6). Inductor fuses pointwise ops and reductions into
generated C++ loops that sum in another order (and vectorised): loss and
gradients agree with eager to 1e-5 absolute / 1e-4 relative (observed: the
loss bit for bit, gradients within 1.2e-7). Each Inductor compilation runs g++; the tests keep their number
small (one tiny GPT, reused shapes) and cache under a per-session directory.
"""

import hashlib
import os
import shutil
import sys

import pytest
import torch

import max_device
from conftest import REPO_ROOT, op_stats, run_python, sanitizer_preloaded

# Inductor runs g++ and loads what it builds: under a preloaded sanitizer
# runtime that tests the compiler, not max_device.
pytestmark = pytest.mark.skipif(sanitizer_preloaded(), reason="Inductor's g++ under a sanitizer runtime")
torch_dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
import gpt  # noqa: E402

DEVICE = "max_device"
CONFIG = gpt.GPTConfig(n_layer=1, n_embd=16, block_size=16)
BATCH = 2
INDUCTOR_TOL = dict(atol=1e-5, rtol=1e-4)
AOT_EAGER_TOL = dict(atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    """Inductor's caches (generated code, compiled .so) under this session's tmp."""
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor_cache"))
    yield
    if saved is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def loss_and_grads(model, loss_fn, tokens, targets):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, tokens, targets)
    loss.backward()
    return loss.detach().cpu(), {name: p.grad.cpu() for name, p in model.named_parameters()}


def model_loss(model, tokens, targets):
    return model.loss(tokens, targets)


def batch(seq=CONFIG.block_size, seed=0):
    tokens, targets = next(gpt.batches(gpt.GPTConfig(block_size=seq), BATCH, 1, seed))
    return tokens.to(DEVICE), targets.to(DEVICE)


def test_dynamo_has_an_interface_for_max_device():
    from torch._dynamo.device_interface import get_interface_for_device
    interface = get_interface_for_device(DEVICE)
    assert get_interface_for_device(f"{DEVICE}:0") is interface
    assert interface.device_count() == torch.max_device.device_count()
    assert interface.is_available() and interface.current_device() == 0
    assert issubclass(interface.Stream, torch.Stream) and issubclass(interface.Event, torch.Event)
    assert interface.get_device_properties(DEVICE).multi_processor_count == os.cpu_count()
    stream = interface.Stream()
    with interface.stream(stream):
        assert interface.current_stream() == stream
    interface.synchronize()


def test_import_max_device_does_not_import_dynamo_and_compile_still_works():
    # Registration waits for torch.compile's own import of dynamo.
    result = run_python(
        "import sys, torch, max_device\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "f = torch.compile(lambda x: x + 1, backend='aot_eager', fullgraph=True)\n"
        "print(f(torch.zeros(2, device='max_device')).tolist())\n"
        "from torch._dynamo.device_interface import get_interface_for_device\n"
        "print(get_interface_for_device('max_device').__name__)\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[1.0,", "1.0]", "MaxDeviceInterface"]


@pytest.mark.parametrize("backend, tol", [("aot_eager", AOT_EAGER_TOL), ("inductor", INDUCTOR_TOL)])
def test_gpt_loss_and_grads_compiled_match_eager(backend, tol):
    model = gpt.make_model(CONFIG, seed=0, device=DEVICE)
    tokens, targets = batch()
    eager = loss_and_grads(model, model_loss, tokens, targets)
    compiled_loss = torch.compile(model_loss, backend=backend, fullgraph=True)
    for seed in range(3):  # same shapes: one compilation, no recompiles
        compiled = loss_and_grads(model, compiled_loss, *batch(seed=seed))
        if seed == 0:
            torch.testing.assert_close(compiled, eager, **tol)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"]
    assert compiled[0].isfinite() and all(g.abs().sum() > 0 for g in compiled[1].values())


def test_inductor_generates_cpp_kernels_and_allocates_on_max_device():
    def f(x, y):
        return (x * y).relu().sum(1) + torch.mm(x, y).sum(0)

    x, y = torch.randn(8, 8, device=DEVICE), torch.randn(8, 8, device=DEVICE)
    for backend in ("inductor", "max_device"):
        torch._dynamo.reset()
        out, (code, *_) = run_and_get_code(torch.compile(f, backend=backend, fullgraph=True), x, y)
        assert out.device.type == DEVICE
        torch.testing.assert_close(out.cpu(), f(x.cpu(), y.cpu()), **INDUCTOR_TOL)
        assert "cpp_fused" in code                                  # a generated C++ kernel
        assert "empty_strided_cpu(" not in code.split("def call")[1]  # no CPU buffers
        assert "device='max_device'" in code and "extern_kernels.mm" in code


def test_inductor_caches_are_keyed_on_max_devices_codegen():
    """Inductor keys its caches on torch's sources only: a cache filled under
    another max_device codegen (another version of compile.py) must not serve
    its code here."""
    from max_device.compile import codegen_cache_tag
    with open(max_device.compile.__file__, "rb") as f:
        assert codegen_cache_tag() == f"max_device-codegen-{hashlib.sha256(f.read()).hexdigest()[:16]}"
    tag = torch.compiler.config.cache_key_tag
    assert codegen_cache_tag() in tag.split()
    x = torch.randn(8, device=DEVICE)

    def compiled_misses(cache_key_tag):
        torch._dynamo.reset()
        counters.clear()
        with torch.compiler.config.patch(cache_key_tag=cache_key_tag):
            torch.compile(lambda t: (t * 3).relu(), fullgraph=True)(x)
        return counters["inductor"]["fxgraph_cache_miss"]

    compiled_misses(tag)  # fills the cache
    assert compiled_misses(tag) == 0  # the same codegen: served from the cache
    assert compiled_misses(tag.replace(codegen_cache_tag(), "max_device-codegen-0123456789abcdef")) == 1


def test_invalidate_drops_compiled_graphs():
    from max_device.compile import invalidate
    f = torch.compile(lambda x: x.relu() + 1, backend="aot_eager", fullgraph=True)
    x = torch.randn(3, device=DEVICE)
    f(x), f(x)
    assert counters["stats"]["unique_graphs"] == 1
    invalidate()
    f(x)
    assert counters["stats"]["unique_graphs"] == 2


def test_dynamic_sequence_length_compiles_once():
    model = gpt.make_model(CONFIG, seed=0, device=DEVICE)
    compiled_loss = torch.compile(model_loss, fullgraph=True, dynamic=True)
    # below block_size: the full length slices the whole causal mask, a
    # case dynamo guards (seq != 16) and compiles separately
    for seq in (8, 11, 15):
        tokens, targets = batch(seq)
        torch.testing.assert_close(loss_and_grads(model, compiled_loss, tokens, targets),
                                   loss_and_grads(model, model_loss, tokens, targets), **INDUCTOR_TOL)
    assert counters["stats"]["unique_graphs"] == 1


def test_graph_break_and_cpu_copy_inside_a_compiled_region():
    def f(x):
        y = x.sin() * 2
        host = y.cpu()            # a device -> host copy inside the graph
        torch._dynamo.graph_break()
        return (y + host.to(DEVICE)).cos(), host

    x = torch.randn(5, device=DEVICE)
    out, host = torch.compile(f)(x)
    expected_host = x.cpu().sin() * 2
    expected = (2 * expected_host).cos()
    assert out.device.type == DEVICE and host.device.type == "cpu"
    torch.testing.assert_close((out.cpu(), host), (expected, expected_host), **INDUCTOR_TOL)
    assert counters["stats"]["unique_graphs"] == 2


@pytest.fixture
def reference_copy(tmp_path, plugin_file, load_plugin):
    """The reference plugin v1 loaded from a working copy, with a fake kernel
    for its custom op reference::version so that dynamo can trace it."""
    path = tmp_path / "libkernels.so"
    shutil.copy(plugin_file("reference"), path)
    plugin = load_plugin(path)
    lib = torch.library.Library("reference", "FRAGMENT")
    torch.library.register_fake("reference::version", lambda x: torch.empty_like(x, dtype=torch.float32),
                                lib=lib)
    yield path, plugin
    lib._destroy()


def calls_served_by(op, owner):
    entry = next(e for e in max_device.list_ops() if e["op"] == op and not e.get("via"))
    return sum(layer["calls"] for layer in entry["layers"] if layer["owner"] == owner)


def test_plugin_ops_in_a_compiled_graph_reach_the_swapped_version(reference_copy, plugin_file):
    path, plugin = reference_copy

    def custom(x, w):
        return torch.ops.reference.version(torch.mm(x, w)) + x.relu()

    def extern_mm(x, w):
        return torch.mm(x, w).relu()

    x, w = torch.randn(4, 4, device=DEVICE), torch.randn(4, 4, device=DEVICE)
    compiled_custom = torch.compile(custom, fullgraph=True)
    compiled_mm = torch.compile(extern_mm, fullgraph=True)
    mm_calls = op_stats("aten::mm.out")[0]
    torch.testing.assert_close(compiled_custom(x, w).cpu(), 1.0 + x.cpu().relu())
    assert op_stats("aten::mm.out")[0] > mm_calls  # Inductor's extern mm reached the plugin
    torch.testing.assert_close(compiled_mm(x, w).cpu(), extern_mm(x.cpu(), w.cpu()), **INDUCTOR_TOL)
    assert counters["stats"]["unique_graphs"] == 2

    shutil.copy(plugin_file("reference_v2"), str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)
    plugin.reload()
    # The compiled graph's extern mm call goes through the dispatcher: the new
    # version serves it, and the graph is not recompiled.
    v2_calls = calls_served_by("aten::mm.out", "reference@2.0.0")
    torch.testing.assert_close(compiled_mm(x, w).cpu(), extern_mm(x.cpu(), w.cpu()), **INDUCTOR_TOL)
    assert calls_served_by("aten::mm.out", "reference@2.0.0") == v2_calls + 1
    assert counters["stats"]["unique_graphs"] == 2
    # A plugin's own op keeps its op object across swaps (its definition
    # outlives every version): that graph is not recompiled either, and its
    # call reaches v2.
    torch.testing.assert_close(compiled_custom(x, w).cpu(), 2.0 + x.cpu().relu())
    assert counters["stats"]["unique_graphs"] == 2


def test_profiler_shows_generated_kernels_and_the_plugin_serving_extern_calls(reference_copy):
    import re
    from torch.profiler import ProfilerActivity, profile
    _, plugin = reference_copy

    def f(x, w):
        return torch.mm(x, w).relu() * 2  # an extern mm, then one fused C++ kernel

    x, w = torch.randn(4, 4, device=DEVICE), torch.randn(4, 4, device=DEVICE)
    compiled = torch.compile(f, fullgraph=True)
    _, (code, *_) = run_and_get_code(compiled, x, w)
    kernels = set(re.findall(r"\b(cpp_fused_\w+)\(", code.split("def call")[1]))
    assert kernels
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled(x, w)
    names = [e.name for e in prof.events()]
    assert kernels <= set(names)
    assert names.count(f"max_device: aten::mm.out <- reference@1.0.0 gen {plugin.generation}") == 1


def test_cpp_wrapper_serves_generated_kernels_and_refuses_extern_calls_clearly():
    # PyTorch 2.13's C++ wrapper reaches ops it does not generate through C
    # shims per device type, which bypass the dispatcher (see compile.py).
    import torch._inductor.config as inductor_config
    x = torch.randn(8, 8, device=DEVICE)
    with inductor_config.patch(cpp_wrapper=True):
        pointwise = torch.compile(lambda x: (x.sin() * 2).sum(1) + 1, fullgraph=True)
        out = pointwise(x)
        assert out.device.type == DEVICE
        torch.testing.assert_close(out.cpu(), (x.cpu().sin() * 2).sum(1) + 1, **INDUCTOR_TOL)
        with pytest.raises(Exception, match="cpp_wrapper=True cannot call aoti_torch_max_device_mm_out"):
            torch.compile(lambda x: torch.mm(x, x).relu(), fullgraph=True)(x)


def test_inductor_generates_the_cpus_kernels_for_max_device():
    # Inductor decides by device.type == "cpu" how a layer norm's variance is
    # computed, whether a division by a constant becomes a multiply, when a
    # reused result is stored, and how a cat is built: max_device is answered
    # as the CPU (the list is in compile.py).
    import re

    def f(x, y):
        h = torch.nn.functional.layer_norm(x, (16,))
        e = (h / 3.0).exp()
        return torch.cat([e.t(), (e * y).t()], 0) * e.sum()

    kernels = {}
    for device in ("cpu", DEVICE):
        torch._dynamo.reset()
        x, y = torch.randn(8, 16, device=device), torch.randn(8, 16, device=device)
        out, (code, *_) = run_and_get_code(torch.compile(f, fullgraph=True), x, y)
        kernels[device] = re.findall(r"async_compile\.cpp_pybinding\((.*?)'''\)", code, re.S)
        torch.testing.assert_close(out.cpu(), f(x.cpu(), y.cpu()), **INDUCTOR_TOL)
    assert kernels[DEVICE] and kernels[DEVICE] == kernels["cpu"]
