"""Hot swap under load: worker threads compute on max_device while the main
thread loads and unloads the reference plugin. Every call must be served
(by the plugin or the CPU fallback) with the CPU's result, and no call may
run on a plugin that is gone."""

import threading

import torch

import max_device
from conftest import run_python

DEVICE = "max_device"
RELOADS = 50


def test_load_unload_while_computing(load_plugin, plugin_file):
    path = plugin_file("reference")
    g = torch.Generator().manual_seed(0)
    x_cpu, y_cpu = torch.randn(64, 33, generator=g), torch.randn(64, 33, generator=g)
    relu_cpu, add_cpu = torch.relu(x_cpu), x_cpu + y_cpu
    x, y = x_cpu.to(DEVICE), y_cpu.to(DEVICE)

    stop = threading.Event()
    errors, iterations = [], [0, 0]

    def worker(index, fn, expected):
        try:
            while not stop.is_set():
                result = fn().cpu()
                if not torch.equal(result, expected):
                    errors.append(f"worker {index}: result differs from the CPU "
                                  f"(max diff {(result - expected).abs().max().item()})")
                    return
                iterations[index] += 1
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(f"worker {index}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(0, lambda: torch.relu(x), relu_cpu)),
               threading.Thread(target=worker, args=(1, lambda: x + y, add_cpu))]
    for t in threads:
        t.start()
    served = 0
    try:
        for _ in range(RELOADS):
            plugin = load_plugin(path)
            # let the workers call into this image before it goes
            deadline = iterations[0] + iterations[1] + 4
            while iterations[0] + iterations[1] < deadline and not errors and all(t.is_alive() for t in threads):
                threading.Event().wait(0.0005)
            served += sum(l["calls"] for e in max_device.list_ops(plugin) if not e["via"]
                          for l in e["layers"])
            report = max_device.unload_plugin(plugin)
            assert report["unmapped"] is True, report
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    assert errors == []
    assert min(iterations) > 0
    assert served > 0, "the plugin never served a call while loaded"
    assert max_device.list_plugins() == []


def test_an_override_that_lists_while_another_thread_changes_never_deadlocks(load_plugin, plugin_file,
                                                                           fixture_file):
    """A Python override runs inside a call; a change on another thread
    waits for calls in flight. Listings from inside the override must not
    wait for that change (it waits for them)."""
    path = fixture_file("good")
    seen = []

    def listing_relu(x):
        plugins = max_device.list_plugins()
        seen.append((len(plugins), len(max_device.list_ops())))
        for p in plugins:
            try:
                max_device.get_plugin(p.name)
            except max_device.PluginStateError:
                pass  # unloaded meanwhile by the other thread
        return NotImplemented

    stop, failures = threading.Event(), []

    def caller():
        x = torch.randn(16, device=DEVICE)
        while not stop.is_set():
            try:
                torch.relu(x)
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))
                return

    with max_device.override("aten::relu", listing_relu):
        thread = threading.Thread(target=caller)
        thread.start()
        try:
            for _ in range(RELOADS):
                max_device.unload_plugin(load_plugin(path))
        finally:
            stop.set()
            thread.join(timeout=60)
    assert not thread.is_alive(), "the caller deadlocked"
    assert failures == [] and seen


def test_fallback_kernels_taken_off_under_running_calls(plugin_file):
    """Each op's CPU fallback kernel leaves the dispatcher's table while
    other threads may be inside it: suspended and resumed by every
    torch.ops.load_library, ended by a plugin's or a torch.library kernel
    for its op. In a fresh process (where every fallback kernel is still
    in place), workers call ops served by those kernels while the main
    thread suspends and resumes them all, loads the reference plugin (its
    ops' kernels end) and registers torch.library kernels (two more end).
    Every result must be the CPU's; under the sanitizers, no call may run
    in a kernel object that was freed."""
    result = run_python(r"""
import sys, threading
import torch, max_device
from max_device import _C

ops = {"aten::add.Tensor": lambda x: x + x, "aten::mul.Tensor": lambda x: x * x, "aten::mm": lambda x: x @ x,
       "aten::sqrt": torch.sqrt, "aten::sin": torch.sin, "aten::maximum": lambda x: torch.maximum(x, -x)}
assert set(ops) <= set(_C._direct_fallback_ops())
x_cpu = torch.rand(16, 16, generator=torch.Generator().manual_seed(0))
x = x_cpu.to("max_device")
stop, errors, calls = threading.Event(), [], [0, 0]

def worker(index):
    try:
        while not stop.is_set():
            for name, fn in ops.items():
                got, expected = fn(x).cpu(), fn(x_cpu)
                if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
                    errors.append(f"{name}: max diff {(got - expected).abs().max().item()}")
                    return
                calls[index] += 1
    except Exception as e:
        errors.append(f"worker {index}: {type(e).__name__}: {e}")

def while_calls_run(change):
    target = sum(calls) + 3
    change()
    while sum(calls) < target and not errors:
        threading.Event().wait(0.0005)

threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
try:
    def suspend_and_resume():
        _C._suspend_direct_fallbacks()
        _C._resume_direct_fallbacks()
    for _ in range(20):
        while_calls_run(suspend_and_resume)
    plugin = max_device.load_plugin(sys.argv[1])  # serves add.out, mul.out, mm.out
    lib = torch.library.Library("aten", "IMPL")
    on_cpu = lambda fn: lambda t: fn(t.cpu()).to("max_device")
    while_calls_run(lambda: lib.impl("sqrt", on_cpu(torch.sqrt), "PrivateUse1"))
    while_calls_run(lambda: lib.impl("sin", on_cpu(torch.sin), "PrivateUse1"))
    for _ in range(20):
        while_calls_run(suspend_and_resume)
    max_device.unload_plugin(plugin)
    while_calls_run(lambda: None)
finally:
    stop.set()
    for t in threads:
        t.join(timeout=60)
assert not any(t.is_alive() for t in threads), "a worker hung"
assert errors == [], errors
ended = {"aten::add.Tensor", "aten::mul.Tensor", "aten::mm", "aten::sqrt", "aten::sin"}
assert ended & set(_C._direct_fallback_ops()) == set()
assert "aten::maximum" in _C._direct_fallback_ops()
print("ok", min(calls))
""", args=(plugin_file("reference"),), timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok"), result.stdout
    assert int(result.stdout.split()[1]) > 0
