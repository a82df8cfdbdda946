"""Reload: a rebuilt plugin takes over in the running process."""

import os
import shutil
import threading

import pytest
import torch

import max_device

DEVICE = "max_device"


def install(source, target):
    """Put a build at `target` the way build systems do: temp file + rename."""
    shutil.copy(source, str(target) + ".tmp")
    os.replace(str(target) + ".tmp", target)


def served_version():
    return torch.ops.reference.version(torch.zeros(3, device=DEVICE))[0].item()


@pytest.fixture
def workdir_plugin(tmp_path, plugin_file, load_plugin):
    """The reference plugin v1 loaded from a working copy in tmp_path."""
    path = tmp_path / "libkernels.so"
    install(plugin_file("reference"), path)
    return path, load_plugin(path)


def test_same_path_rebuild_runs_the_new_code(workdir_plugin, plugin_file):
    path, plugin = workdir_plugin
    assert served_version() == 1.0
    install(plugin_file("reference_v2"), path)
    plugin.reload()
    assert served_version() == 2.0
    assert (plugin.version, plugin.generation) == ("2.0.0", 2)
    assert max_device.list_ops(plugin)[0]["layers"][-1]["owner"] == "reference@2.0.0"


def test_unchanged_file_is_a_no_op_unless_forced(workdir_plugin):
    _, plugin = workdir_plugin
    sha = plugin.sha256
    assert plugin.reload().generation == 1
    assert plugin.sha256 == sha
    assert plugin.reload(force=True).generation == 2


def test_reload_from_another_path_and_rollback(workdir_plugin, plugin_file):
    _, plugin = workdir_plugin
    plugin.reload(plugin_file("reference_v2"))
    assert served_version() == 2.0 and plugin.previous_versions == 1
    plugin.rollback()
    assert served_version() == 1.0 and plugin.generation == 1
    with pytest.raises(max_device.PluginStateError, match="no previous version"):
        plugin.rollback()


def test_a_broken_build_is_refused_and_the_old_version_keeps_serving(workdir_plugin, tmp_path):
    path, plugin = workdir_plugin
    path.write_bytes(b"\x7fELF but not really")
    stacks = lambda: [(e["op"], [l["owner"] for l in e["layers"]]) for e in max_device.list_ops()]  # noqa: E731
    before = stacks()
    with pytest.raises(max_device.BadImageError, match="libkernels.so"):
        plugin.reload()
    assert served_version() == 1.0
    assert stacks() == before


def test_a_custom_op_whose_schema_changed_is_refused(load_plugin, fixture_file):
    plugin = load_plugin(fixture_file("custom_op"), name="ops")
    with pytest.raises(max_device.SchemaError, match="keeps its schema for the life of the process"):
        plugin.reload(fixture_file("custom_op_changed"))
    assert plugin.reload().generation == 1  # unchanged: still serving


def test_ops_a_new_version_drops_fall_to_the_layer_below(load_plugin, plugin_file, fixture_file):
    below = load_plugin(fixture_file("good"))                 # serves aten::neg.out
    top = load_plugin(plugin_file("reference"), name="top")   # serves neg.out too
    neg = next(e for e in max_device.list_ops() if e["op"] == "aten::neg.out")
    assert [l["owner"] for l in neg["layers"]] == ["good@1.0.0", "top@1.0.0"]
    top.reload(fixture_file("failing_kernel"))                # serves only neg.out, failing
    with pytest.raises(max_device.KernelError, match="failed on purpose"):
        torch.neg(torch.ones(2, device=DEVICE))
    top.reload(fixture_file("custom_op"))                     # serves no aten::neg.out at all
    neg = next(e for e in max_device.list_ops() if e["op"] == "aten::neg.out")
    assert [l["owner"] for l in neg["layers"]] == ["good@1.0.0"]
    assert torch.neg(torch.ones(2, device=DEVICE)).tolist() == [-1.0, -1.0]
    assert below.loaded


def test_calls_from_other_threads_never_fail_during_reloads(workdir_plugin, plugin_file):
    path, plugin = workdir_plugin
    stop, seen, errors = threading.Event(), set(), []

    def call():
        x = torch.zeros(8, device=DEVICE)
        while not stop.is_set():
            try:
                v = torch.ops.reference.version(x)
                assert v.eq(v[0]).all()
                seen.add(v[0].item())
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(40):
        plugin.reload(plugin_file("reference_v2" if i % 2 == 0 else "reference"))
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert seen <= {1.0, 2.0}


def test_list_plugins_shows_calls_in_flight(load_plugin, plugin_file):
    plugin = load_plugin(plugin_file("sdk_example"))
    x = torch.ones(4096, 4096, device=DEVICE)
    w = torch.ones(4096, device=DEVICE)
    worker = threading.Thread(target=lambda: [torch.ops.myplug.rms_norm(x, w, 1e-6) for _ in range(20)])
    worker.start()
    seen = 0
    while worker.is_alive():
        seen = max(seen, max_device.get_plugin(plugin.name).calls_in_flight)
    worker.join()
    assert seen == 1
    assert max_device.get_plugin(plugin.name).calls_in_flight == 0
