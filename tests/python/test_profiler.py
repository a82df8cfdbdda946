"""The PyTorch profiler on max_device, as OpenReg's profiler tests use it:
torch.autograd.profiler.profile(use_device="max_device") times every op on
the device through max_device's profiler hooks (host steady clock: kernels
are synchronous), and torch.profiler with the PrivateUse1 activity works."""

import json
import os
import shutil
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

import max_device

DEVICE = "max_device"


def workload():
    x = torch.randn(64, 64, device=DEVICE, requires_grad=True)
    (x @ x).relu().sum().backward()
    return x


def test_use_device_records_device_time(capfd):
    workload()
    with torch.autograd.profiler.profile(use_device=DEVICE) as prof:
        workload()
    # Was: every op callback threw "PrivateUse1 used in profiler but not enabled"
    assert "not enabled" not in capfd.readouterr().err
    events = {e.key: e for e in prof.key_averages()}
    mm = events["aten::mm"]
    assert mm.count >= 3  # forward and two in backward
    assert mm.cpu_time_total > 0 and mm.device_time_total > 0
    for e in prof.key_averages():
        assert e.cpu_time_total >= 0 and e.device_time_total >= 0, e.key
    assert "MAX_DEVICE" in prof.key_averages().table(sort_by="device_time_total", row_limit=5)


def test_kineto_profiler_with_privateuse1_activity(tmp_path):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        workload()
    names = {e.key for e in prof.key_averages()}
    assert {"aten::mm", "aten::relu"} <= names
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    assert any(e.get("name") == "aten::mm" for e in json.loads(trace.read_text())["traceEvents"])


# Provider attribution: every call a provider serves opens a range
# "max_device: <op> <- <provider>" (a plugin as name@version gen N, as in
# list_ops() plus the plugin's generation; "override:<label>"; "cpu fallback").

PREFIX = "max_device: "


def served_by_ranges(prof):
    return Counter(e.name for e in prof.events() if e.name.startswith(PREFIX))


def served_by_counters(plugins):
    """The same counts from max_device's own counters: list_ops() calls of
    the version serving now, and fallback_counts()."""
    generation = {f"{p.name}@{p.version}": p.generation for p in plugins}
    counts = Counter(max_device.fallback_counts())
    counts = Counter({f"{PREFIX}{op} <- cpu fallback": n for op, n in counts.items()})
    for entry in max_device.list_ops():
        if entry["via"]:
            continue
        for layer in entry["layers"]:
            owner = layer["owner"]
            if layer["kind"] == "plugin":
                owner = f"{owner} gen {generation[owner]}"
            counts[f"{PREFIX}{entry['op']} <- {owner}"] += layer["version_calls"]
    return counts


def profiled_counts(plugins, fn):
    """(ranges, counter deltas) of one run of fn under the profiler."""
    before = served_by_counters(plugins)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return served_by_ranges(prof), served_by_counters(plugins) - before


def test_each_call_shows_its_provider_and_the_profiler_agrees_with_list_ops(load_plugin, plugin_file):
    plugin = load_plugin(plugin_file("reference"))
    x = torch.randn(16, 16, device=DEVICE)

    def doubled_relu(x):
        return torch.relu(x) * 2  # the inner relu is served by the plugin

    def workload():
        for _ in range(3):
            torch.relu(x @ x).cos().sum().item()

    with max_device.override("aten::relu", doubled_relu):
        workload()  # warm-up: first-call costs stay out of the profile
        ranges, counted = profiled_counts([plugin], workload)
    assert ranges == counted
    label = f"reference@1.0.0 gen {plugin.generation}"
    assert ranges[f"{PREFIX}aten::mm.out <- {label}"] == 3
    assert ranges[f"{PREFIX}aten::relu <- {label}"] == 3
    assert ranges[f"{PREFIX}aten::relu <- override:{doubled_relu.__qualname__}"] == 3
    assert ranges[f"{PREFIX}aten::cos <- cpu fallback"] == 3  # the form called: a direct fallback


def test_after_a_hot_swap_the_ranges_name_the_new_version(tmp_path, load_plugin, plugin_file):
    path = tmp_path / "libkernels.so"
    shutil.copy(plugin_file("reference"), path)
    plugin = load_plugin(path)
    x = torch.randn(8, device=DEVICE)
    ranges, _ = profiled_counts([plugin], lambda: torch.exp(x))
    assert ranges == {f"{PREFIX}aten::exp.out <- reference@1.0.0 gen 1": 1}
    shutil.copy(plugin_file("reference_v2"), str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)
    plugin.reload()
    ranges, counted = profiled_counts([plugin], lambda: torch.exp(x))
    assert ranges == counted == {f"{PREFIX}aten::exp.out <- reference@2.0.0 gen 2": 1}
