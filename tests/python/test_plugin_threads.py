"""Hot swap under load: worker threads compute on max_device while the main
thread loads and unloads the reference plugin. Every call must be served
(by the plugin or the CPU fallback) with the CPU's result, and no call may
run on a plugin that is gone."""

import threading

import torch

import max_device

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
